"""A ``SPARK_HOME`` whose Python processes import the installed PySpark.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the path of every
Python process it starts: the task workers' daemon, and, for a Python data
source, the processes that look it up, create it, run its stream reader's
driver side and plan its reads, one after the other before a batch's first
task. Python compiles modules imported from a zip file each time (it caches no
bytecode there), so each of them spends ~0.5 s of CPU compiling PySpark where
the pip-installed package, with its ``__pycache__``, imports in ~0.15 s; on a
2-core machine that is seconds of a short run's wall time.

For a run that starts its own JVM in local mode from a pip-installed PySpark
(``SPARK_HOME`` unset), nsq-spark-archive points ``SPARK_HOME`` at a directory
of symbolic links to that installation (``bin``, ``jars``, ...) with no
``python/lib`` in it: the same Spark, whose processes find PySpark where the
job's Python does. The directory sits in the job's cache directory, named
after the installation it links to, and is made under a temporary name and
renamed into place, so concurrent runs never see half of one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid

log = logging.getLogger("nsq_spark.archive")


def installed_spark() -> str | None:
    """The directory of a pip-installed PySpark (its ``jars`` beside its
    modules and ``python/lib/pyspark.zip``), or None."""
    try:
        import pyspark
    except ImportError:
        return None
    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    if os.path.isdir(os.path.join(home, "jars")) and os.path.isfile(os.path.join(home, "python", "lib", "pyspark.zip")):
        return home
    return None


def local_master(master: str | None) -> bool:
    return master is None or master == "local" or master.startswith("local[")


def runs_locally(master: str | None, environ: dict[str, str] | None = None) -> bool:
    """Whether the driver JVM will run the tasks itself: ``master`` (the
    ``--master`` or ``spark.master`` given), else the ``spark.master`` of the
    ``spark-defaults.conf`` spark-submit reads, else the job's ``local[*]``."""
    if master:
        return local_master(master)
    env = os.environ if environ is None else environ
    home = env.get("SPARK_HOME") or installed_spark()
    return local_master(_defaults_master(home, env) if home else None)


def spark_home(cache: str, master: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The ``SPARK_HOME`` to start the driver JVM with, made in ``cache`` if
    need be; None to leave things as they are (``SPARK_HOME`` set by the user,
    PySpark not pip-installed, a cluster master, or the directory cannot be
    made)."""
    env = os.environ if environ is None else environ
    if env.get("SPARK_HOME"):
        return None
    home = installed_spark()
    if home is None or not runs_locally(master, environ):
        return None
    key = hashlib.sha256(home.encode()).hexdigest()[:12]
    target = os.path.join(cache, f"spark-home-{key}")
    if _links_to(target, home):
        return target
    try:
        return _make(target, home)
    except OSError as e:
        log.debug("cannot make %s: %s", target, e)
        return None


def _defaults_master(home: str, env: dict[str, str] | os._Environ[str]) -> str | None:
    """``spark.master`` from the ``spark-defaults.conf`` spark-submit will read."""
    conf_dir = env.get("SPARK_CONF_DIR") or os.path.join(home, "conf")
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf")) as f:
            for line in f:
                words = line.replace("=", " ", 1).split(None, 1)
                if len(words) == 2 and words[0] == "spark.master":
                    return words[1].strip()
    except OSError:
        pass
    return None


def _links_to(target: str, home: str) -> bool:
    return os.path.realpath(os.path.join(target, "jars")) == os.path.realpath(os.path.join(home, "jars"))


def _make(target: str, home: str) -> str:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    building = f"{target}.{uuid.uuid4().hex}.tmp"
    os.makedirs(os.path.join(building, "python"))
    try:
        for name in os.listdir(home):
            if name != "python":
                os.symlink(os.path.join(home, name), os.path.join(building, name))
        for name in os.listdir(os.path.join(home, "python")):
            if name != "lib":
                os.symlink(os.path.join(home, "python", name), os.path.join(building, "python", name))
        try:
            os.rename(building, target)
        except OSError:
            # another run renamed its own first, or an old one is in the way
            if not _links_to(target, home):
                shutil.rmtree(target, ignore_errors=True)
                os.rename(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target
