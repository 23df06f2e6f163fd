"""The test suite. The processes its tests start (nsqd, nsqlookupd, twistd, Spark's
Python workers, the docs' commands) import the nsq-tw the tests import: run from a work
tree, its .py files (the work tree goes on their PYTHONPATH here); run against an
installed package (scripts/test's compiled pass, from a directory holding only tests/),
that package."""

import os
from pathlib import Path


def _same_modules() -> None:
    root = Path(__file__).resolve().parents[1]
    if not (root / "nsqd_tw" / "__init__.py").exists():
        return
    import nsqd_tw

    if Path(nsqd_tw.__file__).resolve().parents[1] != root:
        return  # an installed nsq-tw (the work tree is off sys.path)
    path = os.environ.get("PYTHONPATH", "")
    if str(root) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), path) if p)


_same_modules()
