"""The twistd plugin ships in the wheel and is found once installed."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins
from twisted.trial import unittest

ROOT = Path(__file__).resolve().parents[2]


class PluginTests(unittest.TestCase):
    timeout = 300

    def test_found_in_this_environment(self) -> None:
        names = {p.tapname for p in getPlugins(IServiceMaker)}
        self.assertIn("nsqd", names)
        self.assertIn("nsqlookupd", names)

    def test_wheel_ships_the_plugin_and_pip_install_finds_it(self) -> None:
        out = Path(self.mktemp()).resolve()
        out.mkdir()
        pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        subprocess.run(
            [*pip_wheel, "-w", str(out), str(ROOT)],
            check=True,
            capture_output=True,
        )
        (wheel,) = out.glob("nsq_tw-*.whl")
        names = zipfile.ZipFile(wheel).namelist()
        self.assertIn("twisted/plugins/nsqd_tw_plugin.py", names)
        self.assertIn("twisted/plugins/lookupd_tw_plugin.py", names)
        self.assertNotIn("twisted/__init__.py", names)
        self.assertNotIn("twisted/plugins/__init__.py", names)

        target = out / "site"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
            check=True,
            capture_output=True,
        )
        probe = (
            "from twisted.plugin import getPlugins\n"
            "from twisted.application.service import IServiceMaker\n"
            "import nsqd_tw, sys\n"
            "p = [p for p in getPlugins(IServiceMaker) if p.tapname == 'nsqd']\n"
            "assert [q for q in getPlugins(IServiceMaker) if q.tapname == 'nsqlookupd']\n"
            "import os, twisted.plugins\n"
            "assert nsqd_tw.__file__.startswith(sys.argv[1]), nsqd_tw.__file__\n"
            "here = os.path.join(sys.argv[1], 'twisted', 'plugins')\n"
            "assert here in twisted.plugins.__path__, twisted.plugins.__path__\n"
            "assert os.path.exists(os.path.join(here, 'nsqd_tw_plugin.py'))\n"
            "print(p[0].module if p else 'missing')\n"
        )
        env = dict(os.environ, PYTHONPATH=str(target))
        done = subprocess.run(
            [sys.executable, "-c", probe, str(target)], cwd=str(out), env=env, capture_output=True, text=True
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.strip(), "nsqd_tw.tap")
