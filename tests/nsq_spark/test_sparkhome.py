"""The SPARK_HOME nsq-spark-archive starts a local JVM with: the installed
Spark, linked, without the ``python/lib`` zip files that make every Python
process Spark starts compile PySpark again."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from twisted.trial import unittest

from nsq_spark.sparkhome import installed_spark, spark_home


def real(*parts: str) -> str:
    return os.path.realpath(os.path.join(*parts))


class SparkHomeTests(unittest.TestCase):
    def setUp(self) -> None:
        self.installed = installed_spark()
        self.assertIsNotNone(self.installed, "the test environment installs PySpark from PyPI")
        self.cache = tempfile.mkdtemp(prefix="nsq-spark-home-")

    def test_the_installed_spark_without_its_python_zips(self):
        home = spark_home(self.cache, "local[2]", {})
        assert home is not None and self.installed is not None
        self.assertEqual(os.path.dirname(home), self.cache)
        for name in ("bin", "jars"):
            self.assertEqual(
                os.path.realpath(os.path.join(home, name)), os.path.realpath(os.path.join(self.installed, name))
            )
        self.assertFalse(os.path.exists(os.path.join(home, "python", "lib")))
        # made once, then found
        self.assertEqual(spark_home(self.cache, None, {}), home)
        self.assertEqual([n for n in os.listdir(self.cache) if n.endswith(".tmp")], [])

    def test_a_python_worker_path_finds_the_installed_pyspark(self):
        """What Spark puts first on its Python processes' path, from this home."""
        home = spark_home(self.cache, "local[2]", {})
        assert home is not None
        path = os.pathsep.join(os.path.join(home, "python", "lib", z) for z in ("pyspark.zip", "py4j-src.zip"))
        out = subprocess.run(
            [sys.executable, "-c", "import pyspark.worker, pyspark; print(pyspark.__file__)"],
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert self.installed is not None
        self.assertTrue(os.path.realpath(out.strip()).startswith(os.path.realpath(self.installed)), out)

    def test_left_alone(self):
        # the user's own SPARK_HOME; a cluster master; spark-defaults.conf naming one
        self.assertIsNone(spark_home(self.cache, "local[2]", {"SPARK_HOME": "/opt/spark"}))
        self.assertIsNone(spark_home(self.cache, "spark://127.0.0.1:7077", {}))
        self.assertIsNone(spark_home(self.cache, "yarn", {}))
        conf = tempfile.mkdtemp(prefix="nsq-spark-conf-")
        with open(os.path.join(conf, "spark-defaults.conf"), "w") as f:
            f.write("# cluster\nspark.master   yarn\n")
        self.assertIsNone(spark_home(self.cache, None, {"SPARK_CONF_DIR": conf}))
        self.assertIsNotNone(spark_home(self.cache, "local[1]", {"SPARK_CONF_DIR": conf}))
        self.assertEqual(os.listdir(conf), ["spark-defaults.conf"])

    def test_a_cache_it_cannot_write_leaves_things_as_they_are(self):
        blocked = os.path.join(self.cache, "file")
        with open(blocked, "w"):
            pass
        self.assertIsNone(spark_home(os.path.join(blocked, "below"), "local[2]", {}))

    def test_a_home_in_the_way_is_replaced(self):
        home = spark_home(self.cache, "local[2]", {})
        assert home is not None
        os.unlink(os.path.join(home, "jars"))
        os.symlink(self.cache, os.path.join(home, "jars"))  # an older install's
        self.assertEqual(spark_home(self.cache, "local[2]", {}), home)
        assert self.installed is not None
        self.assertEqual(
            os.path.realpath(os.path.join(home, "jars")), os.path.realpath(os.path.join(self.installed, "jars"))
        )
