"""Go's rules for topic and channel names."""

from __future__ import annotations

import re

_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def is_valid_name(name: str | bytes) -> bool:
    """Go's rule for topic and channel names."""
    if isinstance(name, bytes):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            return False
    if not 1 <= len(name) <= 64:
        return False
    return _NAME_RE.fullmatch(name) is not None


is_valid_topic_name = is_valid_name


is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    return name.endswith("#ephemeral")
