import contextlib
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The modules a consumed (and published) message passes through, compiled by Cython
# in pure-Python mode when a wheel is built (`pip install .`) and Cython and a C
# compiler are there: the same .py files, also installed, are what runs otherwise.
# NSQ_TW_PURE=1 forces pure Python. An editable install (`pip install -e .`) never
# compiles: a .so next to a .py would shadow the .py a developer edits.
COMPILED = [
    "nsq_wire/message.py",
    "nsq_wire/parser.py",
    "nsqd_tw/core/message.py",
    "nsqd_tw/core/pqueue.py",
    "nsqd_tw/core/queue.py",
    "nsqd_tw/core/channelqueue.py",
    "nsqd_tw/core/channel.py",
    "nsqd_tw/storage/diskqueue_read.py",
    "nsqd_tw/storage/records.py",
    "nsqd_tw/tcp/protocol.py",
    "nsqd_tw/tcp/client.py",
    "nsqd_tw/tcp/output.py",
    "nsqd_tw/tcp/connection.py",
]


class OptionalBuildExt(build_ext):
    """Cythonize and compile :data:`COMPILED` when it can; fall back to the .py files
    (a warning, not a failed install) when it cannot."""

    def run(self) -> None:
        self._remove_stale()
        if os.environ.get("NSQ_TW_PURE", "") not in ("", "0"):
            self._skip("NSQ_TW_PURE is set")
        elif self.inplace or getattr(self, "editable_mode", False):
            self._skip("an editable or in-place build keeps the .py files only")
        else:
            try:
                from Cython.Build import cythonize

                for ext, compiled in zip(
                    self.extensions,
                    cythonize(
                        self.extensions,
                        build_dir=os.path.join(self.build_temp, "cython"),  # no .c files in the source tree
                        compiler_directives={
                            "language_level": 3,
                            # the annotations are for mypy: a compiled module accepts what its .py accepts
                            "annotation_typing": False,
                            "binding": True,
                        },
                        quiet=True,
                    ),
                    strict=True,
                ):
                    ext.sources = compiled.sources  # the .c file, on setuptools' own Extension
            except Exception as e:  # no Cython, or it refused a module
                self._skip(f"cythonize failed: {e!r}")
        super().run()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # no compiler, no Python headers, a compile error
            self._remove_built(ext)
            self.warn(f"nsq-tw: {ext.name} not compiled, its .py file is used ({e!r})")

    def _skip(self, why: str) -> None:
        for ext in self.extensions:
            self._remove_built(ext)
        self.extensions = []
        print(f"nsq-tw: pure Python ({why})", file=sys.stderr)

    def _remove_stale(self) -> None:
        """A module an earlier build compiled that is no longer in :data:`COMPILED`
        would go into this wheel from build/lib, shadowing its .py."""
        if self.inplace:
            return
        wanted = {os.path.normpath(self.get_ext_fullpath(ext.name)) for ext in self.extensions}
        for package in {path.split("/")[0] for path in COMPILED}:
            for root, _dirs, files in os.walk(os.path.join(self.build_lib, package)):
                for name in files:
                    path = os.path.normpath(os.path.join(root, name))
                    if name.endswith((".so", ".pyd")) and path not in wanted:
                        with contextlib.suppress(OSError):
                            os.remove(path)

    def _remove_built(self, ext: Extension) -> None:
        """A module an earlier build compiled into build/lib would go into this wheel."""
        if not self.inplace:
            with contextlib.suppress(OSError):
                os.remove(self.get_ext_fullpath(ext.name))


setup(
    name="nsq-tw",
    version="1.3.0",
    description="NSQ (nsqd, nsqlookupd) rebuilt in Python on Twisted, drop-in for the Go binaries",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.11",
    # twisted/plugins has no __init__.py: it is Twisted's plugin namespace, and
    # listing it here ships our plugin modules into it
    packages=[
        "nsq_wire",
        "nsq_client",
        "nsq_service",
        "nsqd_tw",
        "nsqd_tw.core",
        "nsqd_tw.storage",
        "nsqd_tw.tcp",
        "nsqd_tw.http",
        "nsqd_tw.replication",
        "lookupd_tw",
        "nsq_spark",
        "twisted.plugins",
    ],
    # Naming the root makes `pip install -e .` put the checkout on sys.path (a .pth
    # line) rather than install an import hook: Twisted finds plugins by looking
    # for twisted/plugins/ directories on sys.path, and an import hook hides ours.
    package_dir={"": "."},
    package_data={"twisted.plugins": ["nsqd_tw_plugin.py", "lookupd_tw_plugin.py"]},
    # always listed, so that OptionalBuildExt also removes what an earlier build compiled
    # -g0: Python's CFLAGS carry -g, which made the 13 modules 8 MB to map at every start
    ext_modules=[
        Extension(path[:-3].replace("/", "."), [path], extra_compile_args=["-g0"] if os.name == "posix" else [])
        for path in COMPILED
    ],
    cmdclass={"build_ext": OptionalBuildExt},
    install_requires=[
        "twisted>=24.7",
        "klein>=24.8",
        "treq>=24.9",
        "pyopenssl>=25.2",  # Context.set_tls13_ciphersuites
        "service-identity>=24.1",
        "ddsketch>=3.0",  # end-to-end latency quantiles
        "prometheus-client>=0.20",  # GET /metrics
        "python-snappy>=0.7",  # IDENTIFY snappy: the framing format, via cramjam
        "zlib-ng>=0.5",  # IDENTIFY deflate: compressed twice as fast as with zlib (nsq_wire.compression)
    ],
    extras_require={
        # the Spark source, sink and archive job (nsq_spark); Spark needs Java 17+
        "spark": [
            "pyspark>=4.2,<5",
            "pyarrow>=15",
        ],
        # a Spark Connect client (SparkSession.builder.remote("sc://...")) using the
        # nsq data source: pyspark's connect extra (grpcio, grpcio-status,
        # googleapis-common-protos, zstandard, numpy, pandas, pyarrow>=18); pandas
        # below 3, which PySpark 4.3 does not fully support yet (it warns on import)
        "spark-connect": [
            "pyspark[connect]>=4.2,<5",
            "pyarrow>=18",
            "pandas>=2.2,<3",
        ],
        "test": [
            "pynsq>=0.9.1",
            "pyyaml>=6",
            "jsonschema>=4.18",
            "openapi-spec-validator>=0.7",
        ],
        # what scripts/test and CI use: pinned so a new linter release can't break main
        "dev": [
            "pynsq>=0.9.1",
            "pyyaml>=6",
            "jsonschema>=4.18",
            "openapi-spec-validator>=0.7",
            "ruff==0.17.6",
            "mypy==2.4.1",
            "mypy-zope==1.0.17",
            "py-spy>=0.4",
        ],
    },
    entry_points={
        "console_scripts": [
            "nsqd = nsqd_tw.cli:main",
            "nsqlookupd = lookupd_tw.cli:main",
            "nsq-spark-archive = nsq_spark.archive:main",
        ],
    },
    classifiers=[
        "Framework :: Twisted",
        "Programming Language :: Python :: 3",
        "Topic :: System :: Distributed Computing",
    ],
)
