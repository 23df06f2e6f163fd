"""Message IDs: 16 ASCII hex characters, unique on one node.

The layout is Go nsqd's (a snowflake variant): 42 bits of pseudo-milliseconds
(``ns >> 20``) since Go's epoch, 10 bits of node ID, 12 bits of sequence.
Unlike Go, which fails and retries when the clock goes backwards or a
sequence runs out within one tick, this factory borrows the next tick, so a
large MPUB never waits and IDs never repeat or go backwards.
"""

from __future__ import annotations

from collections.abc import Callable

NODE_ID_BITS = 10
SEQUENCE_BITS = 12
NODE_ID_SHIFT = SEQUENCE_BITS
TIMESTAMP_SHIFT = SEQUENCE_BITS + NODE_ID_BITS
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
# ( 2012-10-28 16:23:42 UTC ).UnixNano() >> 20
TWEPOCH = 1288834974288
# every sequence number as the ID's last 3 hex digits (12 bits)
_SEQUENCE_HEX = [b"%03x" % s for s in range(SEQUENCE_MASK + 1)]


class GUIDFactory:
    def __init__(self, node_id: int, now_ns: Callable[[], int]) -> None:
        if not 0 <= node_id < 1024:
            raise ValueError("--node-id must be [0,1024)")
        self.node_id = node_id
        self._now_ns = now_ns
        self._last_ts = 0
        self._sequence = 0

    def _now_ts(self) -> int:
        return max(self._now_ns() >> 20, TWEPOCH)

    def _tick(self) -> int:
        ts = self._now_ts()
        if ts > self._last_ts:
            self._last_ts = ts
            self._sequence = 0
        else:
            self._sequence += 1
            if self._sequence > SEQUENCE_MASK:
                self._last_ts += 1
                self._sequence = 0
        return ((self._last_ts - TWEPOCH) << TIMESTAMP_SHIFT) | (self.node_id << NODE_ID_SHIFT) | self._sequence

    def new_id(self) -> bytes:
        return b"%016x" % self._tick()

    def new_ids(self, n: int) -> list[bytes]:
        """``n`` consecutive IDs in one call (for MPUB)."""
        return [prefix + suffix for prefix, suffixes in self.new_id_runs(n) for suffix in suffixes]

    def new_id_runs(self, n: int) -> list[tuple[bytes, list[bytes]]]:
        """:meth:`new_ids` as runs ``(prefix, suffixes)``: the IDs are each prefix
        followed by each of its suffixes (the last 3 hex digits, the sequence),
        none made yet (nsq_wire.message.numbered_records writes them into records)."""
        ts = self._now_ts()
        if ts > self._last_ts:
            self._last_ts = ts
            self._sequence = -1
        runs: list[tuple[bytes, list[bytes]]] = []
        node = self.node_id << NODE_ID_SHIFT
        while n:
            room = SEQUENCE_MASK - self._sequence
            if room <= 0:
                self._last_ts += 1
                self._sequence = -1
                continue
            take = min(room, n)
            base = ((self._last_ts - TWEPOCH) << TIMESTAMP_SHIFT) | node
            start = self._sequence + 1
            # the sequence is the last 3 hex digits: the rest is the same for the batch
            runs.append((b"%013x" % (base >> SEQUENCE_BITS), _SEQUENCE_HEX[start : start + take]))
            self._sequence += take
            n -= take
        return runs
