"""Files as Go nsqd writes them: atomic replacement, and OS errors in Go's words.

Go prints a failed file operation as ``open /d/nsqd.dat.123.tmp: read-only file
system`` (an ``*os.PathError``); :class:`PathError` is that, and still an OSError.
"""

from __future__ import annotations

import os
import random
import stat

from nsq_wire.gofmt import go_errno


class PathError(OSError):
    """Go's ``*os.PathError``: ``OP PATH: ERRNO TEXT``."""

    def __init__(self, op: str, path: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror, path)
        self.op = op
        self.text = f"{op} {path}: {go_errno(cause)}"

    def __str__(self) -> str:
        return self.text


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Replace a file so that readers see the old or the new content, never half.

    Written to ``PATH.<random>.tmp`` (Go's name), fsynced, renamed over ``path``;
    a failure removes the temporary file and raises :class:`PathError`.
    """
    tmp = f"{path}.{random.getrandbits(63)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as e:
        raise PathError("open", tmp, e) from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as e:
            raise PathError("write", tmp, e) from None
        try:
            os.fsync(fd)
        except OSError as e:
            raise PathError("sync", tmp, e) from None
        finally:
            os.close(fd)
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise PathError("rename", tmp, e) from None
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(path))


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def read_regular(path: str) -> bytes:
    """The content of ``path``, which must be a regular file.

    Opened without blocking: a named pipe in its place (put there by mistake)
    would otherwise block the reactor thread in open() until a writer comes,
    with nsqd listening and deaf to SIGTERM. Raises OSError (FileNotFoundError
    when there is no such file).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "something else")
            raise OSError(f"{os.path.basename(path)} is {kind}, not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
