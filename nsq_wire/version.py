"""The version nsq-tw reports, and the version line of its commands."""

from __future__ import annotations

import sys

VERSION = "1.3.0"


def version_string(app: str) -> str:
    """Go's version.String: ``nsqd v1.3.0 (built w/python3.11.7)``, as ``--version``,
    the first log line and ``/stats`` print it."""
    return f"{app} v{VERSION} (built w/python{sys.version.split()[0]})"
