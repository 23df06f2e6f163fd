"""The servers the bench tools start run the install they were given, even after a
tool imported the tests package (whose start-up points the processes started after it
at the work tree's .py files: bench/run.py --tls measured a pure-Python nsqd so)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from twisted.trial import unittest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, sys
sys.path.insert(0, {bench!r})
import _common
import tests.certs  # what bench/run.py --tls imports for its certificates
print(json.dumps({{"now": os.environ.get("PYTHONPATH"), "server": _common.server_env().get("PYTHONPATH")}}))
"""


class BenchServerEnvTests(unittest.TestCase):
    def probe(self, pythonpath: str | None) -> dict[str, str | None]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        out = subprocess.run(
            [sys.executable, "-c", PROBE.format(bench=str(ROOT / "bench"))],
            env=env,
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    def test_the_tests_package_does_not_reach_the_servers(self):
        seen = self.probe(None)
        if seen["now"] is not None:
            self.assertIn(str(ROOT), seen["now"].split(os.pathsep))  # what the tests package did
        self.assertIsNone(seen["server"])

    def test_the_users_own_pythonpath_is_kept(self):
        self.assertEqual(self.probe("/somewhere/else")["server"], "/somewhere/else")
