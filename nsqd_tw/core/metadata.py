"""``nsqd.dat`` (the topics and channels that survive a restart) and the data-path lock.

The JSON is Go's: ``{"topics":[{"name":..,"paused":..,"channels":[{"name":..,"paused":..}]}],"version":"1.3.0"}``
with ``null`` where Go has a nil slice, so either nsqd can start on the other's data path.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nsq_wire import gojson
from nsq_wire.gofmt import go_errno
from nsq_wire.version import VERSION
from nsqd_tw.storage.files import read_regular

METADATA_FILE = "nsqd.dat"


@dataclass
class ChannelMeta:
    name: str
    paused: bool = False
    settings: Any = None  # beyond Go: the channel's own settings (JSON), an extra key Go ignores
    rewind: Any = None  # beyond Go: where its rewind is (JSON), another extra key
    dropped: int = 0  # beyond Go: dropped_count (bounds), kept across restarts; another extra key


@dataclass
class TopicMeta:
    name: str
    paused: bool = False
    channels: list[ChannelMeta] = field(default_factory=list)
    settings: Any = None
    dropped: int = 0


class MetadataError(Exception):
    pass


def encode_topic(t: TopicMeta) -> str:
    """One topic's entry of nsqd.dat (what :func:`encode_document` joins)."""
    doc: dict[str, Any] = {
        "name": t.name,
        "paused": t.paused,
        "channels": [_channel_entry(c) for c in t.channels] or None,
    }
    return json.dumps(_with_dropped(_with_settings(doc, t.settings), t.dropped), separators=(",", ":"))


def _channel_entry(c: ChannelMeta) -> dict[str, Any]:
    doc = _with_settings({"name": c.name, "paused": c.paused}, c.settings)
    if c.rewind is not None:
        doc["rewind"] = c.rewind
    return _with_dropped(doc, c.dropped)


def _with_dropped(doc: dict[str, Any], dropped: int) -> dict[str, Any]:
    if dropped:  # only then (a bound dropped messages): else Go's bytes
        doc["dropped_count"] = dropped
    return doc


def _with_settings(doc: dict[str, Any], settings: Any) -> dict[str, Any]:
    if settings:  # only then: with none set, nsqd.dat is Go's byte for byte
        doc["settings"] = settings
    return doc


def encode_document(topics: list[str], version: str) -> bytes:
    """nsqd.dat from the topics' entries (:func:`encode_topic`)."""
    listed = "[" + ",".join(topics) + "]" if topics else "null"
    return f'{{"topics":{listed},"version":{json.dumps(version)}}}'.encode()


def encode_metadata(topics: list[TopicMeta], version: str) -> bytes:
    return encode_document([encode_topic(t) for t in topics], version)


class _Queue(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def paused(self) -> bool: ...
    @property
    def ephemeral(self) -> bool: ...
    @property
    def dropped_count(self) -> int: ...
    def settings_json(self) -> dict[str, Any]: ...


class _Channel(_Queue, Protocol):
    def rewind_state(self) -> dict[str, Any] | None: ...


class _Topic(_Queue, Protocol):
    @property
    def channels(self) -> Mapping[str, _Channel]: ...


class MetadataSnapshot:
    """nsqd.dat of the topics as they are, each topic's entry encoded again only
    after it changed (:meth:`changed`): with 10,000 topics a snapshot is a join,
    not an encoding, and a burst of channel creations stays cheap."""

    def __init__(self) -> None:
        self._entries: dict[str, str] = {}

    def changed(self, topic_name: str | None) -> None:
        """The topic (None: every topic) changed: encode it again next time."""
        if topic_name is None:
            self._entries.clear()
        else:
            self._entries.pop(topic_name, None)

    def encode(self, topics: Iterable[_Topic]) -> bytes:
        entries = self._entries
        parts = []
        for t in topics:
            if t.ephemeral:
                continue
            entry = entries.get(t.name)
            if entry is None:
                channels = [
                    ChannelMeta(c.name, c.paused, c.settings_json(), c.rewind_state(), c.dropped_count)
                    for c in t.channels.values()
                    if not c.ephemeral
                ]
                topic = TopicMeta(t.name, t.paused, channels, t.settings_json(), t.dropped_count)
                entry = entries[t.name] = encode_topic(topic)
            parts.append(entry)
        return encode_document(parts, VERSION)


class _Object(list):  # type: ignore[type-arg]
    """A JSON object as its (key, value) pairs in document order."""


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, _Object) else "array"


class _GoTypes:
    """Fill the metadata as Go's json.Unmarshal fills nsqd's Metadata struct:
    keys match case-insensitively, unknown keys and nulls are ignored, the last
    of duplicate keys wins, and the first value of the wrong type is the error
    (with Go's text), decoding going on past it as Go's does."""

    def __init__(self) -> None:
        self.error: str | None = None

    def mismatch(self, value: Any, where: str, go_type: str) -> None:
        if self.error is None:
            self.error = f"json: cannot unmarshal {_kind(value)} into Go {where} of type {go_type}"

    def fields(self, obj: _Object, struct: str, path: str, kinds: dict[str, tuple[type, str]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in obj:
            name = key.lower()
            if name not in kinds:
                continue
            want, go_type = kinds[name]
            if value is None:  # null empties a slice and leaves anything else as it is
                if want is list:
                    out[name] = []
                continue
            if want is list and isinstance(value, list) and not isinstance(value, _Object):
                out[name] = value
            elif want is not list and isinstance(value, want) and (want is bool or not isinstance(value, bool)):
                out[name] = value
            else:
                self.mismatch(value, f"struct field {struct}.{path}{name}", go_type)
        return out

    def structs(self, items: list[Any], struct: str, path: str, go_type: str) -> list[_Object]:
        found = []
        for item in items:
            if item is None:
                found.append(_Object())
            elif isinstance(item, _Object):
                found.append(item)
            else:
                self.mismatch(item, f"struct field {struct}.{path}", go_type)
        return found

    def metadata(self, doc: Any) -> list[TopicMeta]:
        if doc is None:
            return []
        if not isinstance(doc, _Object):
            self.mismatch(doc, "value", "nsqd.Metadata")
            return []
        top = self.fields(doc, "Metadata", "", {"topics": (list, "[]nsqd.TopicMetadata"), "version": (str, "string")})
        topics = []
        for t in self.structs(top.get("topics", []), "Metadata", "topics", "nsqd.TopicMetadata"):
            f = self.fields(
                t,
                "TopicMetadata",
                "topics.",
                {"name": (str, "string"), "paused": (bool, "bool"), "channels": (list, "[]nsqd.ChannelMetadata")},
            )
            channels = []
            for c in self.structs(f.get("channels", []), "TopicMetadata", "topics.channels", "nsqd.ChannelMetadata"):
                cf = self.fields(
                    c, "ChannelMetadata", "topics.channels.", {"name": (str, "string"), "paused": (bool, "bool")}
                )
                channels.append(
                    ChannelMeta(
                        cf.get("name", ""),
                        cf.get("paused", False),
                        _settings_of(c),
                        _extra_of(c, "rewind"),
                        _count_of(c, "dropped_count"),
                    )
                )
            topics.append(
                TopicMeta(
                    f.get("name", ""), f.get("paused", False), channels, _settings_of(t), _count_of(t, "dropped_count")
                )
            )
        return topics


def _settings_of(obj: _Object) -> Any:
    """Our extra ``settings`` key of a topic or channel entry, as plain JSON (None if absent)."""
    return _extra_of(obj, "settings")


def _count_of(obj: _Object, name: str) -> int:
    """An extra count of ours (0 when absent or not a count: never a failed start)."""
    value = _extra_of(obj, name)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63:
        return value
    return 0


def _extra_of(obj: _Object, name: str) -> Any:
    """An extra key of ours in an entry (Go ignores it), as plain JSON (None if absent)."""
    found = None
    for key, value in obj:
        if key == name:
            found = value
    return _plain(found)


def _plain(value: Any) -> Any:
    if isinstance(value, _Object):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


def decode_metadata(data: bytes, path: str) -> list[TopicMeta]:
    """Parse nsqd.dat; errors carry Go's texts so an operator sees what Go nsqd says."""
    try:
        doc = json.loads(data.decode("utf-8", "replace"), object_pairs_hook=_Object, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        text = gojson.syntax_error(data)
        if text is None:  # valid for Go, too deep for Python's parser
            text = f"nesting too deep to decode ({type(e).__name__})"
        raise MetadataError(f"failed to parse metadata in {path} - {text}") from None
    types = _GoTypes()
    topics = types.metadata(doc)
    if types.error is not None:
        raise MetadataError(f"failed to parse metadata in {path} - {types.error}")
    return topics


def read_metadata(path: str) -> list[TopicMeta]:
    try:
        data = read_regular(path)
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

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def lock(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise MetadataError(f"failed to lock data-path: open {self.path}: {go_errno(e)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            raise MetadataError(
                f"failed to lock data-path: cannot flock directory {self.path} - {go_errno(e)} "
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
