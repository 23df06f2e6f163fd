"""The nsq data source's options, checked once on the driver (plain data: it
pickles to the executors). The table of options is in :mod:`nsq_spark.source`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nsq_client.blocking import ConnectOptions, TLSConfig
from nsq_spark.staging import StagingError, local_root
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name


class OptionError(ValueError):
    pass


def _bool(options: dict[str, str], key: str, default: bool = False) -> bool:
    value = options.get(key)
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise OptionError(f"option {key}: {value!r} is not a boolean")


def _int(options: dict[str, str], key: str, default: int, minimum: int = 1) -> int:
    value = options.get(key)
    if value is None:
        return default
    try:
        n = int(str(value).strip())
    except ValueError:
        raise OptionError(f"option {key}: {value!r} is not an integer") from None
    if n < minimum:
        raise OptionError(f"option {key}: {n} is below {minimum}")
    return n


def _seconds(options: dict[str, str], key: str, default: float) -> float:
    value = options.get(key)
    if value is None:
        return default
    text = str(value).strip()
    if text.isdigit():
        return int(text) / 1000.0  # plain numbers are milliseconds, as nsqd's flags
    from nsq_wire.gofmt import DurationError, parse_duration

    try:
        return parse_duration(text)
    except DurationError as e:
        raise OptionError(f"option {key}: {e}") from None


def _list(options: dict[str, str], key: str) -> list[str]:
    return [a.strip() for a in str(options.get(key) or "").split(",") if a.strip()]


@dataclass
class NSQOptions:
    """The options, checked once on the driver; plain data, so it pickles."""

    topic: str
    channel: str
    nsqd_addresses: list[str]
    nsqd_http_addresses: list[str]
    lookupd_addresses: list[str]
    staging_location: str
    tls: TLSConfig
    auth_secret: str | None
    snappy: bool
    deflate: bool
    deflate_level: int
    msg_timeout: float
    max_messages_per_batch: int
    max_in_flight: int
    lookupd_poll_interval: float
    idle_timeout: float
    no_node_timeout: float
    rows_per_partition: int
    body_column: str
    max_message_size: int
    max_body_size: int
    starting_timestamp: str | None = None  # a new query rewinds its channel: Unix ms or "earliest"

    @classmethod
    def parse(cls, raw: Any, reading: bool) -> NSQOptions:
        options = {str(k).lower(): v for k, v in dict(raw).items()}
        topic = str(options.get("topic") or "")
        if not topic:
            raise OptionError('the "topic" option is required')
        if not is_valid_topic_name(topic):
            raise OptionError(f"topic name {topic!r} is not valid (1-64 of [.a-zA-Z0-9_-], optional #ephemeral)")
        channel = str(options.get("channel") or "")
        if reading and not channel:
            raise OptionError('the "channel" option is required to read a topic')
        if channel and not is_valid_channel_name(channel):
            raise OptionError(f"channel name {channel!r} is not valid (1-64 of [.a-zA-Z0-9_-], optional #ephemeral)")
        nsqd = _list(options, "nsqdtcpaddresses")
        nsqd_http = _list(options, "nsqdhttpaddresses")
        lookupd = _list(options, "lookupdhttpaddresses")
        if not nsqd and not lookupd and not (reading and nsqd_http):
            raise OptionError('give "nsqdTcpAddresses" or "lookupdHttpAddresses"')
        staging = str(options.get("staginglocation") or "")
        if reading:
            if not staging:
                raise OptionError(
                    'the "stagingLocation" option is required to read a topic: a directory every executor '
                    "reaches at the same path, e.g. beside the query's checkpointLocation"
                )
            try:
                local_root(staging)
            except StagingError as e:
                raise OptionError(str(e)) from None
        snappy, deflate = _bool(options, "snappy"), _bool(options, "deflate")
        if snappy and deflate:
            raise OptionError("snappy and deflate cannot both be enabled")
        tls = TLSConfig(
            enabled=_bool(options, "tls"),
            root_ca_file=str(options.get("tlsrootcafile") or ""),
            cert_file=str(options.get("tlscertfile") or ""),
            key_file=str(options.get("tlskeyfile") or ""),
            insecure_skip_verify=_bool(options, "tlsinsecureskipverify"),
        )
        max_in_flight = _int(options, "maxinflight", 2500)
        starting = options.get("startingtimestamp")
        if starting is not None:
            starting = str(starting).strip().lower()
            if starting != "earliest" and not (starting.isascii() and starting.isdigit()):
                raise OptionError(f'"startingTimestamp" must be Unix milliseconds or "earliest", not {starting!r}')
            if reading and not nsqd_http and not lookupd:
                raise OptionError(
                    '"startingTimestamp" rewinds the channel through nsqd\'s HTTP API: give "nsqdHttpAddresses" '
                    'or "lookupdHttpAddresses"'
                )
        return cls(
            topic=topic,
            channel=channel,
            nsqd_addresses=nsqd,
            nsqd_http_addresses=nsqd_http,
            lookupd_addresses=lookupd,
            staging_location=staging,
            tls=tls,
            auth_secret=options.get("authsecret"),
            snappy=snappy,
            deflate=deflate,
            deflate_level=_int(options, "deflatelevel", 6),
            msg_timeout=_seconds(options, "msgtimeout", 0.0),
            max_messages_per_batch=_int(options, "maxmessagesperbatch", 10000),
            max_in_flight=max_in_flight,
            lookupd_poll_interval=_seconds(options, "lookupdpollinterval", 60.0),
            idle_timeout=_seconds(options, "idletimeout", 2.0),
            no_node_timeout=_seconds(options, "nonodetimeout", 60.0),
            rows_per_partition=_int(options, "rowsperpartition", 25000),
            body_column=str(options.get("bodycolumn") or ""),
            max_message_size=_int(options, "maxmessagesize", 1048576),
            max_body_size=_int(options, "maxbodysize", 5242880),
            starting_timestamp=starting,
        )

    def connect_options(self) -> ConnectOptions:
        return ConnectOptions(
            tls=self.tls,
            snappy=self.snappy,
            deflate=self.deflate,
            deflate_level=self.deflate_level,
            auth_secret=self.auth_secret,
            msg_timeout_ms=int(self.msg_timeout * 1000),
        )


# -- the archive's own flags -----------------------------------------------------------

MAX_DEDUP_WINDOW_MS = 7 * 86_400_000  # the files a batch with copies reads are bounded by it

_INTERVAL_UNITS_MS = {
    "millisecond": 1,
    "second": 1_000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
}


def window_millis(text: str) -> int:
    """``--dedup-window`` in milliseconds: a Go duration (``10m``), ``0``, or a
    Spark interval (``10 minutes``, ``1 hour 30 minutes``); at most 7 days."""
    words = text.split()
    if len(words) == 1:
        from nsq_wire.gofmt import DurationError, parse_duration_ns

        try:
            ms = parse_duration_ns(words[0]) // 1_000_000
        except DurationError as e:
            raise ValueError(str(e)) from None
    elif not words or len(words) % 2:
        raise ValueError("expected a duration (10m) or an interval (10 minutes)")
    else:
        total = 0.0
        for number, unit in zip(words[::2], words[1::2], strict=True):
            scale = _INTERVAL_UNITS_MS.get(unit.lower().removesuffix("s"))
            try:
                value = float(number)
            except ValueError:
                value = -1.0
            if scale is None or not 0 <= value <= MAX_DEDUP_WINDOW_MS:
                raise ValueError(f"{number} {unit}: expected a number of milliseconds, seconds, minutes, hours, days")
            total += value * scale
        ms = int(total)
    if not 0 <= ms <= MAX_DEDUP_WINDOW_MS:
        raise ValueError("the window is at most 7 days and not negative")
    return ms


def since_millis(text: str, now: float | None = None) -> int:
    """Unix ms of ``--since``: RFC 3339, Unix ms, ``earliest`` (0) or a Go
    duration before ``now``."""
    import time

    from nsq_wire.gofmt import DurationError, parse_duration, parse_rfc3339_ns

    text = text.strip()
    if text == "earliest":
        return 0
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        return -(-parse_rfc3339_ns(text) // 1_000_000)
    except ValueError:
        pass
    try:
        ago = parse_duration(text)
    except DurationError:
        raise ValueError("expected an RFC 3339 time, Unix ms, 'earliest' or a duration such as 2h") from None
    return int(((time.time() if now is None else now) - ago) * 1000)
