"""When the deferred messages written to a disk queue are due (beyond Go).

A deferred message that overflows to disk keeps its deliver-at time across a
restart: ``name.diskqueue.deferred.dat`` (which Go ignores) holds ``ID NS\\n``
lines, appended as messages are deferred and rewritten whole when the queue
syncs at close (or when the appended lines far outnumber the times held).
"""

from __future__ import annotations

import os

from nsqd_tw.storage.files import write_atomic
from nsqd_tw.storage.layout import QueueFiles


class DeferredTimes:
    """The deliver-at times of one queue, by message ID, and their file."""

    def __init__(self, files: QueueFiles) -> None:
        self.files = files
        self.at: dict[bytes, int] = {}
        self.fd: int | None = None  # the file, open for appending
        self._lines = 0
        self._load()

    def _load(self) -> None:
        try:
            with open(self.files.deferred_file, "rb") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and len(parts[0]) == 16:
                        try:
                            self.at[parts[0]] = int(parts[1])
                        except ValueError:
                            continue
        except FileNotFoundError:
            pass

    def set(self, msg_id: bytes, deliver_at_ns: int) -> None:
        self.at[msg_id] = deliver_at_ns
        line = b"%s %d\n" % (msg_id, deliver_at_ns)
        try:
            if self.fd is None:
                self.fd = os.open(self.files.deferred_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(self.fd, line)
            self._lines += 1
        except OSError as e:
            self.files.log.error(
                "DISKQUEUE({name}) failed to record a deferred time - {err}", name=self.files.name, err=e
            )
        if self._lines > 2 * len(self.at) + 100_000:
            self.write()  # compact the append-only log

    def write(self) -> None:
        """Rewrite the file with the times held (remove it if there are none)."""
        self.close()
        self._lines = len(self.at)
        if self.at:
            body = b"".join(b"%s %d\n" % item for item in self.at.items())
            write_atomic(self.files.deferred_file, body)
        else:
            self.files.remove(self.files.deferred_file)

    def clear(self) -> None:
        """Forget every time and remove the file (the queue was emptied or deleted)."""
        self.close()
        self.files.remove(self.files.deferred_file)
        self.at.clear()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
