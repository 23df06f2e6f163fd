"""Stream compression a client negotiates with IDENTIFY.

``snappy`` is the snappy framing format (python-snappy's stream classes, as
Go's github.com/golang/snappy Reader/Writer); ``deflate`` is raw DEFLATE
(no zlib header, as Go's compress/flate) with a sync flush each time nsqd
flushes its output buffer, so the client can decode every frame at once.
It is compressed with zlib-ng (the ``zlib-ng`` package, zlib's API and levels,
about twice as fast: the compression of a consumer's messages is the reactor
thread's), else with the standard library's zlib; it is inflated with zlib.

Decoding is bounded: :meth:`decode` yields the inflated bytes in slices of at
most :data:`DECODE_SLICE`, so a small "bomb" never becomes one huge buffer.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from types import ModuleType


def deflater() -> ModuleType:
    """The zlib module that compresses: zlib-ng's, else zlib. Imported when a
    client first negotiates deflate (zlib-ng's package takes ~15 ms to import:
    not at every start)."""
    try:
        from zlib_ng import zlib_ng
    except ImportError:  # pragma: no cover - zlib-ng is a dependency; a build without it still works
        return zlib
    return zlib_ng


DECODE_SLICE = 1 << 20

# the largest chunk the framing format allows: 64 KiB of input compressed in
# the worst case (32 + n + n/6), plus the 4-byte checksum
_SNAPPY_MAX_CHUNK = 4 + 32 + 65536 + 65536 // 6


class CompressionError(Exception):
    pass


class SnappyCodec:
    name = "snappy"

    def __init__(self) -> None:
        import snappy  # (with cramjam) only once a client negotiates snappy

        self._compressor = snappy.StreamCompressor()
        self._decompressor = snappy.StreamDecompressor()
        self._pending = b""

    def encode(self, data: bytes) -> bytes:
        return bytes(self._compressor.add_chunk(bytes(data)))

    def decode(self, data: bytes) -> Iterator[bytes]:
        buf = self._pending + data if self._pending else data
        # check the headers of the complete chunks ourselves: a corrupt length
        # would otherwise make the decompressor wait for up to 16 MiB
        pos = 0
        while len(buf) - pos >= 4:
            kind = buf[pos]
            length = int.from_bytes(buf[pos + 1 : pos + 4], "little")
            if length > _SNAPPY_MAX_CHUNK:
                raise CompressionError("snappy: corrupt input")
            if kind == 0x01 and length < 4:
                raise CompressionError("snappy: corrupt input")
            if 0x02 <= kind <= 0x7F:
                raise CompressionError("snappy: unsupported input")
            if len(buf) - pos - 4 < length:
                break
            pos += 4 + length
        complete, self._pending = buf[:pos], buf[pos:]
        if not complete:
            return
        try:
            out = self._decompressor.decompress(complete)
        except Exception as e:  # cramjam.DecompressionError and friends
            raise CompressionError(f"snappy: corrupt input ({e})") from None
        for i in range(0, len(out), DECODE_SLICE):
            yield out[i : i + DECODE_SLICE]


class DeflateCodec:
    name = "deflate"

    def __init__(self, level: int, deflate_with: ModuleType | None = None) -> None:
        """``deflate_with``: the zlib module that compresses (default: :func:`deflater`'s)."""
        self.level = level
        if deflate_with is None:
            deflate_with = deflater()
        self._compressor = deflate_with.compressobj(level, deflate_with.DEFLATED, -deflate_with.MAX_WBITS)
        self._sync_flush = deflate_with.Z_SYNC_FLUSH
        self._decompressor = zlib.decompressobj(-zlib.MAX_WBITS)

    def encode(self, data: bytes) -> bytes:
        c = self._compressor
        return c.compress(data) + c.flush(self._sync_flush)

    def decode(self, data: bytes) -> Iterator[bytes]:
        d = self._decompressor
        try:
            while data:
                out = d.decompress(data, DECODE_SLICE)
                data = d.unconsumed_tail
                if out:
                    yield out
                if d.eof:
                    # the client ended its deflate stream: nothing may follow
                    raise CompressionError("flate: stream ended")
        except zlib.error as e:
            raise CompressionError(f"flate: corrupt input ({e})") from None
