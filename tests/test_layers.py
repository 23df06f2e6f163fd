"""The layering docs/architecture.md describes, kept true.

Every import in the product code counts, wherever it is written (module level,
inside a function, under TYPE_CHECKING): a package may import only the packages
its layer allows, nsq_wire and the Spark side never reach Twisted, and no module
imports another in a circle. And no module or class grows past a size a reader
can hold (issue 38: the Go-shaped classes had taken in every feature beyond Go).
"""

from __future__ import annotations

import ast
from pathlib import Path

from twisted.trial import unittest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nsq_wire", "nsq_client", "nsq_service", "nsqd_tw", "lookupd_tw", "nsq_spark")

# a module under the first prefix may import (of ours) only modules under these prefixes
ALLOWED: list[tuple[str, tuple[str, ...]]] = [
    ("nsq_wire", ("nsq_wire",)),
    ("nsq_client", ("nsq_wire", "nsq_client")),
    ("nsq_service", ("nsq_wire", "nsq_service")),
    ("nsqd_tw.storage", ("nsq_wire", "nsqd_tw.storage")),
    ("nsqd_tw.core", ("nsq_wire", "nsq_service", "nsqd_tw.storage", "nsqd_tw.core", "nsqd_tw.options")),
    (
        "nsqd_tw.tcp",
        ("nsq_wire", "nsq_service", "nsqd_tw.core", "nsqd_tw.tcp", "nsqd_tw.options", "nsqd_tw.auth", "nsqd_tw.tls"),
    ),
    (
        "nsqd_tw.http",
        (
            "nsq_wire",
            "nsq_service",
            "nsqd_tw.core",
            "nsqd_tw.storage",
            "nsqd_tw.tcp",
            "nsqd_tw.http",
            "nsqd_tw.options",
            "nsqd_tw.lookup",
            "nsqd_tw.replication",
        ),
    ),
    (
        "nsqd_tw.replication",
        (
            "nsq_wire",
            "nsq_service",
            "nsqd_tw.core",
            "nsqd_tw.storage",
            "nsqd_tw.options",
            "nsqd_tw.tls",
            "nsqd_tw.replication",
        ),
    ),
    ("nsqd_tw", ("nsq_wire", "nsq_service", "nsq_client", "nsqd_tw")),
    ("lookupd_tw", ("nsq_wire", "nsq_service", "lookupd_tw")),
    ("nsq_spark", ("nsq_wire", "nsq_client.blocking", "nsq_spark")),
]
# third-party packages a layer must never import
TWISTED = ("twisted", "klein", "treq", "zope", "OpenSSL", "werkzeug", "prometheus_client", "service_identity")
NO_TWISTED = ("nsq_wire", "nsq_client.blocking", "nsq_spark")

# lines: Go's whole nsqd/channel.go is 617; a feature beyond Go gets a module of its own
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 450


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, ours: dict[str, Path]) -> set[str]:
    """Every module ``name`` imports: ours by module, others by top-level package."""
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add(alias.name if alias.name in ours else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in ours:
                    out.add(full)
                elif base in ours:
                    out.add(base)
                else:
                    out.add(base.split(".")[0])
    out.discard(name)
    return out


def layer_of(name: str) -> tuple[str, tuple[str, ...]]:
    for prefix, allowed in ALLOWED:  # the most specific prefix comes first
        if name == prefix or name.startswith(prefix + "."):
            return prefix, allowed
    raise AssertionError(f"{name} is in no layer")


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


class LayerTests(unittest.TestCase):
    def setUp(self) -> None:
        self.ours = modules()
        self.graph = {name: imports(name, path, self.ours) for name, path in self.ours.items()}

    def test_each_package_imports_only_what_its_layer_allows(self) -> None:
        wrong = []
        for name, deps in sorted(self.graph.items()):
            prefix, allowed = layer_of(name)
            for dep in sorted(deps):
                if dep in self.ours and not under(dep, allowed):
                    wrong.append(f"{name} imports {dep} (a {prefix} module may import {', '.join(allowed)})")
        self.assertEqual(wrong, [])

    def test_the_wire_package_and_the_spark_side_never_reach_twisted(self) -> None:
        wrong = []
        for start in self.ours:
            if not under(start, NO_TWISTED):
                continue
            seen, todo = set(), [start]
            while todo:
                mod = todo.pop()
                if mod in seen:
                    continue
                seen.add(mod)
                for dep in self.graph.get(mod, ()):
                    if dep in self.ours:
                        todo.append(dep)
                    elif dep in TWISTED:
                        wrong.append(f"{start} reaches {dep} through {mod}")
        self.assertEqual(wrong, [])

    def test_no_module_imports_another_in_a_circle(self) -> None:
        cycles = strongly_connected(
            [n for n in self.graph], {n: {d for d in ds if d in self.ours} for n, ds in self.graph.items()}
        )
        self.assertEqual([c for c in cycles if len(c) > 1], [])


class SizeTests(unittest.TestCase):
    def test_no_module_over_600_lines_and_no_class_over_450(self) -> None:
        wrong = []
        for name, path in sorted(modules().items()):
            text = path.read_text(encoding="utf-8")
            lines = text.count("\n")
            if lines > MAX_MODULE_LINES:
                wrong.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef):
                    size = (node.end_lineno or node.lineno) - node.lineno + 1
                    if size > MAX_CLASS_LINES:
                        wrong.append(f"{name}.{node.name}: {size} lines (at most {MAX_CLASS_LINES})")
        self.assertEqual(wrong, [])


def strongly_connected(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    out.append(sorted(comp))
    return out


class CommandLineWithoutTwistedTests(unittest.TestCase):
    """``nsqd --version`` and ``--help`` (and nsqlookupd's) need no reactor: they
    answer without importing Twisted (or TLS), which alone costs most of a start."""

    def answer(self, module: str, flag: str) -> tuple[int, str, list[str]]:
        import json
        import subprocess
        import sys

        probe = (
            "import json, sys\n"
            f"from {module} import main\n"
            "try:\n"
            f"    code = main([{flag!r}])\n"
            "except SystemExit as e:\n"
            "    code = e.code\n"
            "heavy = ('twisted', 'zope', 'klein', 'treq', 'OpenSSL', 'ssl')\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
            "sys.stderr.write(json.dumps([code, heavy]))\n"
        )
        done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
        code, heavy = json.loads(done.stderr.strip().splitlines()[-1])
        return code, done.stdout, heavy

    def test_version_and_help(self) -> None:
        for app, module in (("nsqd", "nsqd_tw.cli"), ("nsqlookupd", "lookupd_tw.cli")):
            code, out, heavy = self.answer(module, "--version")
            self.assertEqual((code, heavy), (0, []), module)
            self.assertTrue(out.startswith(f"{app} v"), out)
            code, out, heavy = self.answer(module, "--help")
            self.assertEqual((code, heavy), (0, []), module)
            self.assertIn("-tcp-address", out)
