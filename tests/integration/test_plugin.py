"""The twistd plugin ships in the wheel and is found once installed, editable or not."""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
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

    def test_editable_install_finds_the_plugin(self) -> None:
        """``pip install -e .``, as contributors install, gives ``twistd nsqd``."""
        work = Path(self.mktemp()).resolve()
        work.mkdir()
        src = work / "src"
        shutil.copytree(ROOT, src, ignore=_not_source)
        env = work / "env"
        venv.create(env, with_pip=False)
        python = env / "bin" / "python"
        site = Path(
            subprocess.run(
                [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        # the packages this test runs with (pip, setuptools, twisted, ...) but not nsq-tw itself
        base = work / "base"
        _installed_without_nsq_tw(base)
        (site / "zz_base.pth").write_text(f"{base}\n")

        run = {"cwd": str(work), "capture_output": True, "text": True, "env": _clean_env()}
        twistd = [python, "-c", "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"]
        done = subprocess.run(
            [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", src], **run
        )
        self.assertEqual(done.returncode, 0, done.stderr)

        done = subprocess.run([*twistd, "--help"], **run)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertRegex(done.stdout, r"\n\s+nsqd\s+NSQ daemon")
        self.assertRegex(done.stdout, r"\n\s+nsqlookupd\s+NSQ discovery service")
        done = subprocess.run([*twistd, "nsqd", "--version"], **run)
        self.assertEqual((done.returncode, done.stdout[:12]), (0, "nsqd v1.3.0 "), done.stderr)
        done = subprocess.run([*twistd, "nsqlookupd", "--help"], **run)
        self.assertIn("--tombstone-lifetime", done.stdout, done.stderr)

        # the code twistd runs is the working copy: an edit shows without reinstalling
        probe = "import nsqd_tw.tap, twisted.plugins; print(nsqd_tw.tap.__file__)"
        done = subprocess.run([python, "-c", probe], **run)
        self.assertEqual(done.stdout.strip(), str(src / "nsqd_tw" / "tap.py"), done.stderr)


def _not_source(directory: str, names: list[str]) -> set[str]:
    junk = {".git", ".venv", "build", "dist", "__pycache__", "dropin.cache", "data"}
    return {n for n in names if n in junk or n.startswith("_trial_temp") or n.endswith(".egg-info")}


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_NO_INDEX"] = "1"
    return env


def _installed_without_nsq_tw(base: Path) -> None:
    """Link every package installed next to this test into ``base``, except nsq-tw's own files."""
    site = Path(sysconfig.get_paths()["purelib"])
    ours: set[str] = set()
    try:
        ours = {str(f) for f in importlib.metadata.distribution("nsq-tw").files or []}
    except importlib.metadata.PackageNotFoundError:
        pass
    top = {name.split("/", 1)[0] for name in ours} - {"twisted"}
    base.mkdir()
    for entry in site.iterdir():
        if entry.name in top or entry.name in ("twisted", "__pycache__"):
            continue
        (base / entry.name).symlink_to(entry)
    # twisted itself, with its plugin directory minus ours
    (base / "twisted" / "plugins").mkdir(parents=True)
    for entry in (site / "twisted").iterdir():
        if entry.name != "plugins":
            (base / "twisted" / entry.name).symlink_to(entry)
    for entry in (site / "twisted" / "plugins").iterdir():
        if f"twisted/plugins/{entry.name}" not in ours and entry.name not in ("dropin.cache", "__pycache__"):
            (base / "twisted" / "plugins" / entry.name).symlink_to(entry)
