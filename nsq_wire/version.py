"""The version nsq-tw reports, and the version line of its commands."""

from __future__ import annotations

VERSION = "1.3.0"


def version_string(app: str = "nsqd") -> str:
    return f"{app} v{VERSION} (built w/{python_version()})"


def python_version() -> str:
    import platform

    return "python" + platform.python_version()
