"""A body's gzip member kept open before its tail, so that lines can go in there per scrape.

The ``process_*`` series are read at each scrape, the body once per
publication. Compressing the body again per scrape, or even only extending
its CRC over it, costs a scrape time in proportion to the body (megabytes at
a large node). :class:`OpenGzip` compresses the body up to ``cut`` once,
flushed to a byte boundary (a deflate block that is not the last), and keeps
the CRC there: a scrape's lines and the body's tail (``# EOF`` in OpenMetrics,
else nothing) are compressed by a deflate stream of their own, whose blocks
follow, and the CRC is extended over them alone. The result is one ordinary
gzip member. No compressor is kept between scrapes: one holds a quarter of a
mebibyte, for lines that refer to nothing in the body before them.
"""

from __future__ import annotations

import struct
import zlib

_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
"""A gzip member's header: deflate, no flags, no time, unknown OS (as RFC 1952 allows)."""
_TRAILER = struct.Struct("<II")
_LINES_WBITS = 9
"""The lines' stream looks back 512 bytes at most, at the least memory level (1): a
compressor of that size is made in a tenth of a full one's time, for the same few lines
(any inflater reads a stream that looks back less than its window)."""


class OpenGzip:
    """``body`` gzipped, open at ``cut``: :meth:`with_lines` puts lines in there."""

    __slots__ = ("_crc", "_cut", "_level", "_tail", "_whole", "head")

    def __init__(self, body: bytes, cut: int, level: int) -> None:
        if not 0 <= cut <= len(body):
            raise ValueError(f"cut {cut} outside a body of {len(body)} bytes")
        view = memoryview(body)
        compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self.head = _HEADER + compressor.compress(view[:cut]) + compressor.flush(
            zlib.Z_SYNC_FLUSH)
        """The member up to ``cut``: its header and the body's compressed head."""
        self._level = level
        self._crc = zlib.crc32(view[:cut])
        self._cut = cut
        self._tail = bytes(view[cut:])
        self._whole: bytes | None = None

    def with_lines(self, lines: bytes) -> bytes:
        """The member of the body with ``lines`` at ``cut``."""
        if not lines and self._whole is not None:
            return self._whole
        rest = lines + self._tail
        compressor = zlib.compressobj(self._level, zlib.DEFLATED, -_LINES_WBITS, 1)
        out = b"".join((self.head, compressor.compress(rest), compressor.flush(),
                        _TRAILER.pack(zlib.crc32(rest, self._crc),
                                      (self._cut + len(rest)) & 0xFFFFFFFF)))
        if not lines:
            self._whole = out
        return out
