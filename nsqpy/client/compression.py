"""Stream codecs a connection switches to after IDENTIFY (spec 1.8, 10.3).

Deflate is raw DEFLATE (wbits -15) in both directions, sync-flushed after each write batch so the peer can
decode every batch as it arrives. Snappy is the framing format, through `nsqpy.protocol.snappy_stream` (on
cramjam), imported only when a connection asks for snappy so that `import nsqpy.client` stays light.
"""

from __future__ import annotations

import zlib

__all__ = ["Deflate", "Snappy", "check_supported"]


class Deflate:
    def __init__(self, level: int):
        self._compress = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._decompress = zlib.decompressobj(-15)

    def encode(self, data: bytes) -> bytes:
        return self._compress.compress(data) + self._compress.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data: bytes) -> bytes:
        return self._decompress.decompress(data)


class Snappy:
    def __init__(self):
        from nsqpy.protocol.snappy_stream import SnappyDecoder, SnappyEncoder
        self._encoder, self._decoder = SnappyEncoder(), SnappyDecoder()

    def encode(self, data: bytes) -> bytes:
        return self._encoder.encode(data)

    def decode(self, data: bytes) -> bytes:
        """Every whole chunk received so far, decoded (a partial chunk waits for the rest)."""
        self._decoder.feed(data)
        return self._decoder.read(1 << 62)


def check_supported(snappy: bool) -> None:
    """Fail before dialling when snappy is asked for and its codec cannot load."""
    if snappy:
        try:
            import nsqpy.protocol.snappy_stream  # noqa: F401
        except ImportError as err:
            raise NotImplementedError(f"snappy needs nsqpy.protocol.snappy_stream and cramjam ({err}); "
                                      "use deflate=True") from None
