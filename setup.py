from setuptools import setup

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
    install_requires=[
        "twisted>=24.7",
        "klein>=24.8",
        "treq>=24.9",
        "pyopenssl>=24.0",
        "service-identity>=24.1",
        "ddsketch>=3.0",  # end-to-end latency quantiles
        "prometheus-client>=0.20",  # GET /metrics
        "python-snappy>=0.7",  # IDENTIFY snappy: the framing format, via cramjam
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
