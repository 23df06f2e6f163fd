"""Where each recent dead letter came from (beyond Go).

An NSQ message has no headers: a dead letter keeps its ID, body, timestamp and
attempts, and nowhere to say which channel gave up on it. nsqd remembers that
here, by dead-letter topic and message ID, for the most recent
:data:`LEDGER_SIZE` dead letters, and keeps it in ``dead_letters.json`` under
the data path (written at most once a second, read at start): a dead-letter
consumer asks ``GET /topic/dead_letter?topic=T&id=ID``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

LEDGER_SIZE = 10_000
LEDGER_FILE = "dead_letters.json"


class DeadLetterLedger:
    def __init__(self, size: int = LEDGER_SIZE) -> None:
        self.size = size
        self._origins: OrderedDict[tuple[str, bytes], dict[str, Any]] = OrderedDict()
        self.changed = False

    def record(self, topic: str, msg_id: bytes, origin: dict[str, Any]) -> None:
        """``origin``: ``topic``, ``channel``, ``attempts``, ``reason``, ``timestamp`` (ns)."""
        key = (topic, msg_id)
        self._origins.pop(key, None)
        self._origins[key] = origin
        while len(self._origins) > self.size:
            self._origins.popitem(last=False)
        self.changed = True

    def origin(self, topic: str, msg_id: bytes) -> dict[str, Any] | None:
        return self._origins.get((topic, msg_id))

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._origins if k[0] == topic]:
            del self._origins[key]
            self.changed = True

    def encode(self) -> bytes:
        self.changed = False
        entries = [{"dead_letter_topic": t, "id": i.decode("latin-1"), **o} for (t, i), o in self._origins.items()]
        return json.dumps(entries, separators=(",", ":")).encode()

    def load(self, data: bytes) -> None:
        """Entries from :meth:`encode`'s bytes; raises ValueError for bytes that are not."""
        entries = json.loads(data)
        if not isinstance(entries, list):
            raise ValueError("not a list of dead letters")
        for entry in entries:
            if not isinstance(entry, dict):
                raise ValueError("not a list of dead letters")
            entry = dict(entry)
            topic, msg_id = entry.pop("dead_letter_topic", None), entry.pop("id", None)
            if isinstance(topic, str) and isinstance(msg_id, str):
                self.record(topic, msg_id.encode("latin-1"), entry)
        self.changed = False
