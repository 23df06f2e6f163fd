"""When the deferred messages written to a disk queue are due (beyond Go).

A deferred message that overflows to disk keeps its deliver-at time across a
restart: ``name.diskqueue.deferred.dat`` (which Go ignores) holds ``ID NS\\n``
lines, appended as messages are deferred and rewritten whole when the queue
syncs at close, and while running whenever the lines outnumber the times held
by more than twice (so the file stays within a few times what it must hold).

A time is held until its message is read from the queue; in acknowledged mode
(durable) until the message is done, since after a crash it is read again.

The same file keeps, in acknowledged mode, the *tombstones* of records dropped
(by a bound, by the TTL) while an older record is still owned, so that the
persisted read position has not passed them: ``ID drop FILE POS`` lines, until
the read position passes the record, so that a crash does not bring it back.
"""

from __future__ import annotations

import os

from nsqd_tw.storage.files import read_regular, write_atomic
from nsqd_tw.storage.layout import QueueFiles

# lines a deferred-times file may hold beyond twice the times it must keep
COMPACT_SLACK = 1000


class DeferredTimes:
    """The deliver-at times of one queue, by message ID, and their file."""

    def __init__(self, files: QueueFiles) -> None:
        self.files = files
        self.at: dict[bytes, int] = {}  # messages not read yet
        self.held: dict[bytes, int] = {}  # read, not yet done (acknowledged mode)
        self.dropped: dict[bytes, tuple[int, int]] = {}  # tombstones: ID -> (file, position)
        self.fd: int | None = None  # the file, open for appending
        self._lines = 0
        self._load()

    def _load(self) -> None:
        try:
            data = read_regular(self.files.deferred_file)
        except FileNotFoundError:
            return
        except OSError as e:
            self.files.log.error(
                "DISKQUEUE({name}) failed to read the deferred times - {err}", name=self.files.name, err=e
            )
            return
        for line in data.splitlines():
            parts = line.split()
            try:
                if len(parts) == 2 and len(parts[0]) == 16:
                    self.at[parts[0]] = int(parts[1])
                elif len(parts) == 4 and len(parts[0]) == 16 and parts[1] == b"drop":
                    self.dropped[parts[0]] = (int(parts[2]), int(parts[3]))
            except ValueError:
                continue
        self._lines = len(data.splitlines())

    def set(self, msg_id: bytes, deliver_at_ns: int) -> None:
        self.at[msg_id] = deliver_at_ns
        self._append(b"%s %d\n" % (msg_id, deliver_at_ns))

    def drop(self, msg_id: bytes, file: int, pos: int) -> None:
        """A tombstone: the record of ``msg_id`` at ``file``/``pos`` is gone for good."""
        self.dropped[msg_id] = (file, pos)
        self._append(b"%s drop %d %d\n" % (msg_id, file, pos))

    def undrop(self, msg_id: bytes) -> None:
        """The read position passed a tombstone's record: it is not needed any more."""
        if self.dropped.pop(msg_id, None) is not None:
            self._maybe_compact()

    def _append(self, line: bytes) -> None:
        try:
            if self.fd is None:
                self.fd = os.open(self.files.deferred_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(self.fd, line)
            self._lines += 1
        except OSError as e:
            self.files.log.error(
                "DISKQUEUE({name}) failed to record a deferred time - {err}", name=self.files.name, err=e
            )
        self._maybe_compact()

    def take(self, msg_id: bytes, hold: bool) -> int | None:
        """The time of a message being read (None if it has none); ``hold``: keep
        it (on file) until :meth:`done`."""
        at = self.at.pop(msg_id, None)
        if at is None:
            return self.held.get(msg_id)
        if hold:
            self.held[msg_id] = at
        else:
            self._maybe_compact()
        return at

    def done(self, msg_id: bytes) -> None:
        """The message of a held time is done: its time need not survive a crash."""
        if self.held.pop(msg_id, None) is not None:
            self._maybe_compact()

    def _maybe_compact(self) -> None:
        if self._lines > 2 * (len(self.at) + len(self.held) + len(self.dropped)) + COMPACT_SLACK:
            try:
                self.write()
            except OSError as e:
                self.files.log.error(
                    "DISKQUEUE({name}) failed to rewrite the deferred times - {err}", name=self.files.name, err=e
                )

    def write(self) -> None:
        """Rewrite the file with the times held (remove it if there are none)."""
        self.close()
        times = {**self.held, **self.at}
        self._lines = len(times) + len(self.dropped)
        if self._lines:
            body = b"".join(b"%s %d\n" % item for item in times.items())
            body += b"".join(b"%s drop %d %d\n" % (i, f, p) for i, (f, p) in self.dropped.items())
            write_atomic(self.files.deferred_file, body)
        else:
            self.files.remove(self.files.deferred_file)

    def clear(self) -> None:
        """Forget every time and remove the file (the queue was emptied or deleted)."""
        self.close()
        self.files.remove(self.files.deferred_file)
        self.at.clear()
        self.held.clear()
        self.dropped.clear()
        self._lines = 0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
