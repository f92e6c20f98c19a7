"""The pure parts: snappy framing (against python-snappy's framed codec, and bad input), AuthState's matching."""
from __future__ import annotations

import os

import pytest
import snappy

from nsqpy.protocol.snappy_stream import STREAM_IDENTIFIER, SnappyDecoder, SnappyEncoder, SnappyError
from nsqpy.workers.connections.auth import AuthServerError, AuthState


def test_snappy_round_trips_with_python_snappy_both_ways():
    data = os.urandom(5000) + b"a" * 300_000 + b"tail"
    ours = SnappyEncoder().encode(data)
    assert snappy.StreamDecompressor().decompress(ours) == data
    theirs = snappy.StreamCompressor()
    stream = theirs.compress(data[:70_000]) + theirs.compress(data[70_000:])
    d = SnappyDecoder()
    out = b""
    for i in range(0, len(stream), 777):  # byte-ragged arrival
        d.feed(stream[i:i + 777])
        out += d.read(1 << 30)
    assert out == data


def test_snappy_read_is_paced_by_its_limit():
    d = SnappyDecoder()
    d.feed(SnappyEncoder().encode(b"z" * (1 << 20)))
    first = d.read(1)
    assert len(first) == 65536  # one chunk at a time: a bomb is inflated only as fast as it is consumed
    assert len(first) + len(d.read(1 << 30)) == 1 << 20


@pytest.mark.parametrize("stream", [
    b"\x00\x05\x00\x00hello",                                  # no stream identifier first
    b"\xff\x06\x00\x00sNaPpX",                                 # a wrong one
    STREAM_IDENTIFIER + b"\x02\x01\x00\x00x",                  # reserved unskippable type
    STREAM_IDENTIFIER + b"\x00\xff\xff\xff",                   # a chunk longer than any valid one
    STREAM_IDENTIFIER + b"\x01\x09\x00\x00\x00\x00\x00\x00hello",  # bad CRC
    STREAM_IDENTIFIER + b"\x00\x08\x00\x00\x00\x00\x00\x00\xff\xff\xff\x0f",  # declares 32 MiB uncompressed
])
def test_snappy_rejects(stream):
    d = SnappyDecoder()
    d.feed(stream)
    with pytest.raises(SnappyError):
        d.read(1 << 30)


def test_snappy_skips_padding_and_skippable_chunks():
    d = SnappyDecoder()
    d.feed(STREAM_IDENTIFIER + b"\xfe\x03\x00\x00abc" + b"\x80\x01\x00\x00z" + SnappyEncoder().encode(b"ok")[10:])
    assert d.read(100) == b"ok"


def _state(*auths, ttl=60):
    return AuthState.from_reply(f'{{"ttl": {ttl}, "authorizations": [{",".join(auths)}]}}')


def test_auth_matching_is_nsqds():
    s = _state('{"topic": "^logs", "channels": [".*"], "permissions": ["publish"]}',
               '{"topic": "metrics", "channels": ["^ro$"], "permissions": ["subscribe"]}',
               '{"topic": "both", "channels": ["x"], "permissions": ["publish", "subscribe"]}')
    assert s.allows("logs-a", "")              # publish: a channel rule must match ""
    assert not s.allows("a-logs", "")          # anchored by the rule itself
    assert not s.allows("logs-a", "ch")        # subscribe not granted on logs
    assert s.allows("app-metrics-1", "ro")     # unanchored topic rule
    assert not s.allows("metrics", "rw")
    assert not s.allows("metrics", "")         # no publish there
    assert not s.allows("both", "")            # "x" does not match "" (publish needs an empty-matching rule)
    assert s.allows("both", "xy")
    assert s.permission_count == 3 and not s.expired()


@pytest.mark.parametrize("body", ['{"ttl": 0, "authorizations": []}', '{"ttl": "5", "authorizations": []}',
                                  '{"authorizations": []}', "not json",
                                  '{"ttl": 5, "authorizations": [{"topic": "(", "channels": [], "permissions": []}]}',
                                  '{"ttl": 5, "authorizations": [{"topic": ".*", "channels": [".*"], '
                                  '"permissions": ["admin"]}]}'])
def test_invalid_auth_replies(body):
    with pytest.raises(AuthServerError):
        AuthState.from_reply(body)


def test_state_survives_a_hand_over():
    s = _state('{"topic": "t", "channels": [".*"], "permissions": ["publish"]}')
    t = AuthState.from_blob(s.blob())
    assert t.allows("t", "") and t.expires == s.expires and t.permission_count == 1
