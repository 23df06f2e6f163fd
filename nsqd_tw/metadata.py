"""``nsqd.dat`` (the topics and channels that survive a restart) and the data-path lock.

The JSON is Go's: ``{"topics":[{"name":..,"paused":..,"channels":[{"name":..,"paused":..}]}],"version":"1.3.0"}``
with ``null`` where Go has a nil slice, so either nsqd can start on the other's data path.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from dataclasses import dataclass, field
from typing import Any

METADATA_FILE = "nsqd.dat"


@dataclass
class ChannelMeta:
    name: str
    paused: bool = False


@dataclass
class TopicMeta:
    name: str
    paused: bool = False
    channels: list[ChannelMeta] = field(default_factory=list)


class MetadataError(Exception):
    pass


def encode_metadata(topics: list[TopicMeta], version: str) -> bytes:
    doc: dict[str, Any] = {
        "topics": [
            {
                "name": t.name,
                "paused": t.paused,
                "channels": [{"name": c.name, "paused": c.paused} for c in t.channels] or None,
            }
            for t in topics
        ]
        or None,
        "version": version,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_metadata(data: bytes, path: str) -> list[TopicMeta]:
    try:
        doc = json.loads(data)
        topics = []
        for t in doc.get("topics") or []:
            channels = [ChannelMeta(str(c["name"]), bool(c.get("paused"))) for c in t.get("channels") or []]
            topics.append(TopicMeta(str(t["name"]), bool(t.get("paused")), channels))
        return topics
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise MetadataError(f"failed to parse metadata in {path} - {e}") from None


def read_metadata(path: str) -> list[TopicMeta]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise MetadataError(f"failed to read metadata from {path} - {e}") from None
    if not data:
        return []
    return decode_metadata(data, path)


class DirLock:
    """An exclusive flock on the data path, held while nsqd runs (Go's dirlock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def lock(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise MetadataError(f"failed to lock data-path: open {self.path}: {_go_errno(e)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            raise MetadataError(
                f"failed to lock data-path: cannot flock directory {self.path} - {_go_errno(e)} "
                "(possibly in use by another instance of nsqd)"
            ) from None
        self._fd = fd

    def unlock(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


_GO_ERRNO = {
    errno.EAGAIN: "resource temporarily unavailable",
    errno.ENOENT: "no such file or directory",
    errno.EACCES: "permission denied",
    errno.ENOTDIR: "not a directory",
}


def _go_errno(e: OSError) -> str:
    if e.errno is not None and e.errno in _GO_ERRNO:
        return _GO_ERRNO[e.errno]
    return (e.strerror or str(e)).lower()
