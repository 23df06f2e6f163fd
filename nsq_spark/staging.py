"""Staging files: where a micro-batch's messages become durable before nsqd
hears FIN.

Layout under the ``stagingLocation`` option (the archive puts it in its
checkpoint)::

    <root>/<query id>/<batch>/part-<partition>.arrow

Each file is an Arrow IPC file holding one partition's rows, written whole
under a temporary name and then published with ``link(2)``, which fails if the
name exists: the first attempt of a task to finish wins, and a file that is
visible is complete. A retried or speculative attempt, or a replay after the
driver restarted, finds the file and reads it instead of taking new messages,
so a batch's content is fixed once staged.

Supported filesystems: local disks and POSIX filesystems mounted on every
executor at the same path (NFS, CephFS, Lustre...): ``link(2)`` is atomic and
never replaces an existing name there. The file and its directory are fsynced
before the messages are FINed.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa


class StagingError(ValueError):
    pass


def local_root(location: str) -> str:
    """The local path of ``location`` (a path or a ``file:`` URL)."""
    if "://" in location or location.startswith("file:"):
        url = urlparse(location)
        if url.scheme != "file":
            raise StagingError(
                f"stagingLocation {location!r}: only local or mounted POSIX filesystems (a path or a file: URL) "
                "can hold staging files"
            )
        location = url.path
    if not location:
        raise StagingError("stagingLocation is empty")
    return os.path.abspath(location)


@dataclass(frozen=True)
class Staged:
    """What the driver learns from a staged partition without reading its rows."""

    rows: int
    caught_up: bool  # availableNow: the task met a message newer than the run's start


class StagingArea:
    def __init__(self, location: str) -> None:
        self.root = local_root(location)

    def batch_dir(self, query: str, batch: int) -> str:
        return os.path.join(self.root, query, str(batch))

    def part_path(self, query: str, batch: int, part: int) -> str:
        return os.path.join(self.batch_dir(query, batch), f"part-{part}.arrow")

    # -- executors ----------------------------------------------------------------------

    def load(self, path: str) -> pa.Table | None:
        """The staged rows, or None when no attempt has staged them yet."""
        try:
            source = pa.memory_map(path)
        except FileNotFoundError:
            return None
        with source:
            return pa.ipc.open_file(source).read_all()

    def claim(self, path: str, table: pa.Table, caught_up: bool) -> bool:
        """Make ``table`` the partition's content unless another attempt did
        first (then False). Durable on return."""
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        schema = table.schema.with_metadata({b"nsq.caught_up": b"1" if caught_up else b"0"})
        try:
            with open(tmp, "wb") as f:
                with pa.ipc.new_file(f, schema) as writer:
                    writer.write_table(table.replace_schema_metadata(schema.metadata))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            _fsync_dir(directory)
            return True
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    # -- the driver -----------------------------------------------------------------------

    def summary(self, query: str, batch: int) -> dict[int, Staged]:
        """Rows and flags of each staged partition of a batch (footers only)."""
        out: dict[int, Staged] = {}
        directory = self.batch_dir(query, batch)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return out
        for name in names:
            if not (name.startswith("part-") and name.endswith(".arrow")):
                continue
            with pa.memory_map(os.path.join(directory, name)) as source:
                reader = pa.ipc.open_file(source)
                rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
                caught_up = (reader.schema.metadata or {}).get(b"nsq.caught_up") == b"1"
            out[int(name[5:-6])] = Staged(rows, caught_up)
        return out

    def drop_through(self, query: str, batch: int) -> None:
        """Remove the staging files of every batch up to ``batch`` (committed)."""
        directory = os.path.join(self.root, query)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            if name.isdigit() and int(name) <= batch:
                shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
