"""Per-topic and per-channel settings (beyond Go): dead letters, TTL, bounds, retention.

A topic or channel has its *own* settings (set over HTTP, kept in ``nsqd.dat``
as an extra ``settings`` key that Go's nsqd ignores). What applies to a queue,
its :class:`Policy`, is for each key the queue's own value, else (for a
channel) its topic's, else the default from nsqd's flags. Nothing set anywhere
is Go's behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nsq_wire.gofmt import DurationError, go_duration, parse_duration
from nsq_wire.names import is_ephemeral, is_valid_topic_name

OVERFLOW_POLICIES = ("reject", "drop_oldest")
MAX_ATTEMPTS_LIMIT = 65535  # the wire's attempts counter is 16 bits


class SettingsError(ValueError):
    """A refused setting; ``str()`` says which key and why."""


def _int_in(low: int, high: int | None) -> Callable[[str, Any], int]:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingsError(f"{key} must be an integer")
        if value < low or (high is not None and value > high):
            bound = f"[{low},{high}]" if high is not None else f">= {low}"
            raise SettingsError(f"{key} must be {bound}")
        return value

    return check


def _duration(key: str, value: Any) -> float:
    if not isinstance(value, str):
        raise SettingsError(f'{key} must be a duration string such as "30s" or "1h"')
    try:
        seconds = parse_duration(value)
    except DurationError:
        raise SettingsError(f"{key}: invalid duration {value!r}") from None
    if seconds <= 0:
        raise SettingsError(f"{key} must be positive")
    return seconds


def _duration_or_off(key: str, value: Any) -> float:
    """A duration, or ``"0"``/``"0s"``: none (overrides a default)."""
    if isinstance(value, str):
        try:
            if parse_duration(value) == 0:
                return 0.0
        except DurationError:
            pass
    return _duration(key, value)


def _duration_text(seconds: float) -> str:
    return go_duration(round(seconds * 1e9))


def _topic_name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not is_valid_topic_name(value):
        raise SettingsError(f"{key} must be a valid topic name")
    return value


def _dead_letter_topic(key: str, value: Any) -> str:
    """A topic name, not an ephemeral one: an ephemeral topic drops what its
    memory cannot hold, and a dead letter must never be dropped on arrival."""
    name = _topic_name(key, value)
    if is_ephemeral(name):
        raise SettingsError(f"{key} must not be ephemeral (an #ephemeral topic drops what it cannot hold)")
    return name


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SettingsError(f"{key} must be true or false")
    return value


def _overflow(key: str, value: Any) -> str:
    if value not in OVERFLOW_POLICIES:
        raise SettingsError(f"{key} must be one of {', '.join(OVERFLOW_POLICIES)}")
    return str(value)


# key -> (check a JSON value and return it as kept, how it is written back to JSON)
_KEYS: dict[str, tuple[Callable[[str, Any], Any], Callable[[Any], Any]]] = {
    "max_attempts": (_int_in(1, MAX_ATTEMPTS_LIMIT), int),
    "dead_letter_topic": (_dead_letter_topic, str),
    "expire_to_dead_letter": (_bool, bool),
    "max_age": (_duration, _duration_text),
    "max_depth": (_int_in(0, None), int),
    "max_bytes": (_int_in(0, None), int),
    "overflow": (_overflow, str),
    "retention": (_duration_or_off, _duration_text),
    "retention_bytes": (_int_in(0, None), int),
}
KEYS = tuple(_KEYS)
TOPIC_ONLY = ("retention", "retention_bytes")  # a topic's retained log: not a channel's
CHANNEL_KEYS = tuple(k for k in KEYS if k not in TOPIC_ONLY)


def parse_settings(doc: Any) -> dict[str, Any]:
    """A settings object as sent over HTTP or kept in nsqd.dat: key -> value
    kept, ``None`` for a key to clear. Raises :class:`SettingsError`."""
    if not isinstance(doc, Mapping):
        raise SettingsError("settings must be a JSON object")
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in _KEYS:
            raise SettingsError(f"unknown setting {key!r} (known: {', '.join(KEYS)})")
        out[key] = None if value is None else _KEYS[key][0](key, value)
    return out


def parse_kept_settings(doc: Any) -> tuple[dict[str, Any], list[str]]:
    """Settings as kept in nsqd.dat, key by key: the values that pass the checks,
    and why each of the others does not (a bad value costs its key alone)."""
    if not isinstance(doc, Mapping):
        return {}, ["settings must be a JSON object"]
    kept: dict[str, Any] = {}
    refused: list[str] = []
    for key, value in doc.items():
        if value is None:
            continue
        try:
            kept.update(parse_settings({key: value}))
        except SettingsError as e:
            refused.append(str(e))
        except Exception as e:  # anything a hand-edited file holds: never a failed start
            refused.append(f"{key}: {type(e).__name__}")
    return kept, refused


def loaded_settings(doc: Any, where: str, log: Any) -> dict[str, Any]:
    """A queue's settings from nsqd.dat: a value that does not pass the checks
    is left out with a warning (the others apply), never a failed start."""
    if doc is None:
        return {}
    kept, refused = parse_kept_settings(doc)
    for why in refused:
        log.warn("ignoring a setting of {where} in nsqd.dat - {err}", where=where, err=why)
    return kept


def settings_json(own: Mapping[str, Any]) -> dict[str, Any]:
    """Settings as JSON values, in the keys' order."""
    return {k: _KEYS[k][1](own[k]) for k in KEYS if own.get(k) is not None}


def merge_settings(own: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``own`` with ``changes`` applied: a value sets its key, None clears it."""
    merged = dict(own)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def default_dead_letter_topic(topic_name: str) -> str:
    """``<topic>.dead`` (an ephemeral topic's dead letters go to a lasting topic)."""
    return topic_name.removesuffix("#ephemeral") + ".dead"


@dataclass(frozen=True)
class Policy:
    """What applies to one queue, each key resolved; the defaults are Go's behaviour."""

    max_attempts: int = 0  # 0: no limit
    dead_letter_topic: str = ""  # "" with max_attempts: <topic>.dead
    expire_to_dead_letter: bool = False
    max_age: float = 0.0  # seconds; 0: no TTL
    max_depth: int | None = None  # None: no bound
    max_bytes: int | None = None
    overflow: str = "reject"
    retention: float = 0.0  # seconds a topic keeps what is published; 0: no time limit
    retention_bytes: int = 0  # the most its retained log holds; 0: no byte limit

    @property
    def bounded(self) -> bool:
        return self.max_depth is not None or self.max_bytes is not None

    @property
    def retained(self) -> bool:
        """The topic keeps a retained log."""
        return bool(self.retention or self.retention_bytes)

    @property
    def active(self) -> bool:
        """Anything beyond Go applies."""
        return bool(self.max_attempts or self.dead_letter_topic or self.max_age or self.bounded or self.retained)

    def dead_letter_to(self, topic_name: str) -> str | None:
        """Where a channel of ``topic_name`` with this policy sends dead letters
        (None: it has no dead-letter topic)."""
        if self.dead_letter_topic:
            return self.dead_letter_topic
        if self.max_attempts or (self.expire_to_dead_letter and self.max_age):
            return default_dead_letter_topic(topic_name)
        return None

    def as_json(self, topic_name: str) -> dict[str, Any]:
        dead = self.dead_letter_to(topic_name)
        return {
            "max_attempts": self.max_attempts or None,
            "dead_letter_topic": dead,
            "expire_to_dead_letter": self.expire_to_dead_letter,
            "max_age": _duration_text(self.max_age) if self.max_age else None,
            "max_depth": self.max_depth,
            "max_bytes": self.max_bytes,
            "overflow": self.overflow,
            "retention": _duration_text(self.retention) if self.retention else None,
            "retention_bytes": self.retention_bytes or None,
        }


def resolve(*layers: Mapping[str, Any], keys: tuple[str, ...] = KEYS) -> Policy:
    """The policy from layers of own settings, most specific first (``keys``:
    those that apply; a channel's are :data:`CHANNEL_KEYS`)."""
    values: dict[str, Any] = {}
    for key in keys:
        for layer in layers:
            value = layer.get(key)
            if value is not None:
                values[key] = value
                break
    return Policy(**values)


def defaults_from_options(opts: Any) -> dict[str, Any]:
    """The flags' defaults (``--max-attempts`` ...) as a layer of settings."""
    layer: dict[str, Any] = {
        "max_attempts": opts.max_attempts or None,
        "dead_letter_topic": opts.dead_letter_topic or None,
        "expire_to_dead_letter": opts.expire_to_dead_letter or None,
        "max_age": opts.max_age or None,
        "max_depth": opts.max_depth if opts.max_depth >= 0 else None,
        "max_bytes": opts.max_queue_bytes if opts.max_queue_bytes >= 0 else None,
        "overflow": opts.overflow,
        "retention": opts.retention or None,
        "retention_bytes": opts.retention_bytes or None,
    }
    return layer


def check_defaults(opts: Any) -> None:
    """The flags' values, checked as settings are (raises SettingsError)."""
    if opts.max_attempts:
        _int_in(1, MAX_ATTEMPTS_LIMIT)("--max-attempts", opts.max_attempts)
    if opts.dead_letter_topic:
        _dead_letter_topic("--dead-letter-topic", opts.dead_letter_topic)
    if opts.max_age < 0:
        raise SettingsError("--max-age must be >= 0")
    if opts.retention < 0:
        raise SettingsError("--retention must be >= 0")
    if opts.retention_bytes < 0:
        raise SettingsError("--retention-bytes must be >= 0")
    _overflow("--overflow", opts.overflow)
