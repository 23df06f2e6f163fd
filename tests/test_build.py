"""setup.py's build of the compiled modules: what an earlier build left in build/lib
never goes into a wheel as a module that is not compiled now."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from twisted.trial import unittest

ROOT = Path(__file__).resolve().parents[1]


class StaleModuleTests(unittest.TestCase):
    def setUp(self) -> None:
        self.tree = Path(tempfile.mkdtemp(prefix="nsq-build-"))
        self.addCleanup(shutil.rmtree, self.tree, ignore_errors=True)
        for name in ("setup.py", "pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, self.tree / name)
        self.build_lib = self.tree / "build" / "lib"
        self.suffix = sysconfig.get_config_var("EXT_SUFFIX")

    def left(self, module: str) -> Path:
        """A .so an earlier build left for ``module`` (dotted)."""
        path = self.build_lib / (module.replace(".", "/") + self.suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not a module")
        return path

    def build_ext(self, **env: str) -> None:
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(self.build_lib)],
            cwd=self.tree,
            env={**os.environ, **env},
            check=True,
            capture_output=True,
        )

    def test_a_module_no_longer_compiled_is_removed(self) -> None:
        # (found: a build with more modules listed, then one without them, shipped their .so:
        # a compiled storage.layout that refused the map its callers pass)
        stale = self.left("nsqd_tw.storage.layout")
        other = self.build_lib / "nsqd_tw" / "storage" / "layout.py"
        other.write_text("")
        self.build_ext(NSQ_TW_PURE="1")
        self.assertFalse(stale.exists())
        self.assertTrue(other.exists(), "only extension modules are removed")

    def test_a_pure_build_removes_the_compiled_modules(self) -> None:
        built = self.left("nsqd_tw.core.pqueue")
        self.build_ext(NSQ_TW_PURE="1")
        self.assertFalse(built.exists())


class BothWaysTests(unittest.TestCase):
    def test_the_processes_a_test_starts_import_what_it_imports(self) -> None:
        """scripts/test's first pass runs the work tree's .py files, its second the
        compiled install: the nsqd a process test starts must be the same build
        (tests/__init__.py)."""
        import nsqd_tw.core.pqueue

        probe = "import nsqd_tw.core.pqueue as m; print(m.__file__)"
        done = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, check=True)
        self.assertEqual(done.stdout.strip(), nsqd_tw.core.pqueue.__file__)
