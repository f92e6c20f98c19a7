"""Snappy's framing format (the "stream" format nsqd speaks after a snappy upgrade), sans-IO and bounded.

Encoding is cramjam's framed compressor (one stream identifier, then CRC-checked chunks of at most 64 KiB).
Decoding is done here chunk by chunk instead of with a whole-stream decoder, because what a client sends is
untrusted: a chunk header announces its length before its bytes arrive, so a chunk that could not be valid
(a compressed chunk longer than the largest a 64 KiB block compresses to, a declared uncompressed length above
64 KiB, a reserved unskippable type) is refused before anything is buffered or inflated. Memory per stream is
thus one chunk of input plus what the caller takes out (``read(limit)``): a decompression bomb costs 64 KiB at
a time, paced by the caller. Each chunk's CRC-32C is checked by cramjam (the chunk is decoded as a one-chunk
framed stream), as golang/snappy's reader does.

Chunk layout: 1 byte type, 3 bytes little-endian length, then the data. Types: 0xff stream identifier
("sNaPpY"), 0x00 compressed (4-byte masked CRC-32C + raw snappy block), 0x01 uncompressed (CRC + bytes),
0xfe padding and 0x80-0xfd skippable (ignored), 0x02-0x7f reserved (an error).
"""
from __future__ import annotations

import cramjam

__all__ = ["SnappyEncoder", "SnappyDecoder", "SnappyError", "STREAM_IDENTIFIER"]

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
MAX_BLOCK = 65536
# The longest a 64 KiB block can compress to (snappy's MaxEncodedLen: 32 + n + n/6), plus the 4-byte CRC.
MAX_CHUNK = 32 + MAX_BLOCK + MAX_BLOCK // 6 + 4
MAX_SKIPPABLE = 1 << 24  # a skippable chunk is dropped as it arrives, never held


class SnappyError(ValueError):
    """The peer's snappy stream is malformed (the connection is dropped)."""


class SnappyEncoder:
    def __init__(self):
        self._c = cramjam.snappy.Compressor()

    def encode(self, data) -> bytes:
        """Frame and compress data; the first call also emits the stream identifier."""
        if not data:
            return b""
        self._c.compress(bytes(data))  # the framed encoder cuts its input into <= 64 KiB chunks itself
        return bytes(self._c.flush())


class SnappyDecoder:
    def __init__(self):
        self._buf = bytearray()
        self._seen_identifier = False
        self._skip = 0  # bytes of a skippable chunk still to drop

    def feed(self, data) -> None:
        self._buf += data

    @property
    def pending(self) -> int:
        """Compressed bytes held (never more than one chunk plus one read's worth)."""
        return len(self._buf)

    def read(self, limit: int) -> bytes:
        """Decode whole chunks until about ``limit`` bytes came out or the input runs short."""
        out = []
        got = 0
        buf = self._buf
        while got < limit:
            if self._skip:
                n = min(self._skip, len(buf))
                del buf[:n]
                self._skip -= n
                if self._skip:
                    break
            if len(buf) < 4:
                break
            kind = buf[0]
            length = buf[1] | buf[2] << 8 | buf[3] << 16
            if kind == 0xFF:
                if length != 6:
                    raise SnappyError("bad stream identifier")
            elif not self._seen_identifier:
                raise SnappyError("stream does not start with the identifier")
            if kind in (0x00, 0x01) and length > MAX_CHUNK:
                raise SnappyError(f"chunk of {length} bytes exceeds the format's limit")
            if 0x02 <= kind <= 0x7F:
                raise SnappyError(f"reserved unskippable chunk type {kind:#x}")
            if kind >= 0x80 and kind != 0xFF:  # padding or skippable: dropped as it arrives
                del buf[:4]
                self._skip = length
                continue
            if len(buf) < 4 + length:
                break
            chunk = bytes(buf[:4 + length])
            del buf[:4 + length]
            if kind == 0xFF:
                if chunk[4:] != b"sNaPpY":
                    raise SnappyError("bad stream identifier")
                self._seen_identifier = True
                continue
            if length < 4:
                raise SnappyError("chunk shorter than its checksum")
            if kind == 0x00:
                try:
                    size = cramjam.snappy.decompress_raw_len(chunk[8:])
                except Exception as e:
                    raise SnappyError(f"corrupt compressed chunk: {e}") from None
                if size > MAX_BLOCK:
                    raise SnappyError(f"chunk inflates to {size} bytes (limit {MAX_BLOCK})")
            elif length - 4 > MAX_BLOCK:
                raise SnappyError("uncompressed chunk longer than 64 KiB")
            try:
                data = bytes(cramjam.snappy.decompress(STREAM_IDENTIFIER + chunk))
            except Exception as e:  # bad CRC or a corrupt block
                raise SnappyError(f"corrupt chunk: {e}") from None
            out.append(data)
            got += len(data)
        return b"".join(out)
