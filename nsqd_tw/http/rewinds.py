"""Beyond Go: rewinds from a topic's retained log (docs/replay.md):
``/channel/rewind`` (a channel gets again what was published since a time) and
``/channel/create?since=`` (a new channel that starts from the retained past;
Go's ``/channel/create`` hands it here when ``since`` names a channel not there
yet). Both go through the NSQD's :class:`~nsqd_tw.core.retention.Retention`."""

from __future__ import annotations

from typing import Any

from twisted.web.server import Request

from nsq_service.web import HTTPError, route
from nsq_wire.gofmt import parse_rfc3339_ns, rfc3339_nano
from nsqd_tw.core.retention import RewindError
from nsqd_tw.core.topic import DrainingError, Topic
from nsqd_tw.http.drain import DRAINING
from nsqd_tw.http.routes import FeatureRoutes
from nsqd_tw.storage.faults import RetainedGap
from nsqd_tw.storage.retained import SinceTooOld


class RewindRoutes(FeatureRoutes):
    """The rewind routes of :class:`nsqd_tw.http.api.NSQDHTTPAPI` (a mixin of it)."""

    def _create_since(self, topic: Topic, name: str, params: dict[str, list[str]]) -> Any:
        """A new channel that gets the retained past from ``since`` on, then what
        is published from now on (checked before the channel is made)."""
        since = _since(params)
        if self.nsqd.draining:
            raise HTTPError(503, DRAINING)
        try:
            self.nsqd.retention.create_channel_since(topic, name, since)
        except DrainingError:
            raise HTTPError(503, DRAINING) from None
        except (RewindError, SinceTooOld, RetainedGap) as e:
            raise _refused(e) from None
        return self._persisted()

    @route("/channel/rewind", "POST")
    def channel_rewind(self, request: Request) -> Any:
        """The channel gets again every retained message published at or after
        ``since``, with what it has queued; answered once nsqd.dat has the rewind."""
        channel = self._existing_channel(request)
        since = _since(self.query(request))
        if self.nsqd.draining:
            raise HTTPError(503, DRAINING)
        try:
            rewind = self.nsqd.retention.start_rewind(channel, since)
        except (RewindError, SinceTooOld, RetainedGap) as e:
            raise _refused(e) from None
        answer: dict[str, Any] = {
            "topic": channel.topic_name,
            "channel": channel.name,
            "since": rewind.stats()["since"],
            "messages": rewind.left + rewind.queued,
        }
        gaps = self.nsqd.retention.gaps_crossed(rewind)
        if gaps:  # segments missing from the log: the rewind skips them
            answer["gaps"] = [g.answer() for g in gaps]
        d = self._persisted()
        return answer if d is None else d.addCallback(lambda _: answer)


def _since(params: dict[str, list[str]]) -> int | None:
    """``since``: Unix milliseconds, an RFC 3339 time (ns precision), or
    ``earliest`` (None: from the oldest message retained)."""
    if "since" not in params:
        raise HTTPError(400, "MISSING_ARG_SINCE")
    text = params["since"][0]
    if text == "earliest":
        return None
    if text.isascii() and text.isdigit():
        return int(text) * 1_000_000
    try:
        return parse_rfc3339_ns(text)
    except ValueError:
        raise HTTPError(400, "INVALID_ARG_SINCE") from None


def _refused(e: Exception) -> HTTPError:
    """Why a rewind cannot start, 400: the topic retains nothing (NO_RETENTION),
    ``since`` is before what it retains, or inside a gap of its log."""
    if isinstance(e, SinceTooOld):
        return _too_old(e)
    if isinstance(e, RetainedGap):
        return _in_gap(e)
    return HTTPError(400, "NO_RETENTION")


def _too_old(e: SinceTooOld) -> HTTPError:
    """400, naming the earliest time from which every message is retained."""
    earliest = rfc3339_nano(e.horizon_ns)
    return HTTPError(
        400,
        f"SINCE_TOO_OLD: messages are retained from {earliest} on",
        {"earliest": earliest, "earliest_ms": -(-e.horizon_ns // 1_000_000)},
    )


def _in_gap(e: RetainedGap) -> HTTPError:
    """400, naming the messages missing from the log and the first time accepted after them."""
    gap = e.gap
    first, last = rfc3339_nano(gap.after_ns), rfc3339_nano(gap.before_ns)
    return HTTPError(
        400,
        f"RETAINED_GAP: messages published from {first} to {last} are missing from the retained log",
        {
            "missing_from": first,
            "missing_to": last,
            "missing_to_ms": -(-gap.before_ns // 1_000_000),
            "segments": [gap.first, gap.last],
        },
    )
