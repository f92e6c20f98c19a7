"""Client-role encoders: every command as exact bytes (table)."""

import pytest

from nsqpy.protocol import client as c

ID = b"0123456789abcdef"

ENCODED = [
    (c.magic(), b"  V2"),
    (c.identify({"client_id": "a", "feature_negotiation": True}),
     b'IDENTIFY\n\x00\x00\x00\x2c{"client_id":"a","feature_negotiation":true}'),
    (c.auth("s3cret"), b"AUTH\n\x00\x00\x00\x06s3cret"),
    (c.auth(b"\x00"), b"AUTH\n\x00\x00\x00\x01\x00"),
    (c.sub("topic", "chan#ephemeral"), b"SUB topic chan#ephemeral\n"),
    (c.pub("t", b"hello"), b"PUB t\n\x00\x00\x00\x05hello"),
    (c.mpub("t", [b"a", b"bc"]), b"MPUB t\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc"),
    (c.dpub("t", 1500, b"x"), b"DPUB t 1500\n\x00\x00\x00\x01x"),
    (c.rdy(0), b"RDY 0\n"),
    (c.rdy(2500), b"RDY 2500\n"),
    (c.fin(ID), b"FIN 0123456789abcdef\n"),
    (c.req(ID, 0), b"REQ 0123456789abcdef 0\n"),
    (c.req(ID, 60000), b"REQ 0123456789abcdef 60000\n"),
    (c.touch(ID), b"TOUCH 0123456789abcdef\n"),
    (c.cls(), b"CLS\n"),
    (c.nop(), b"NOP\n"),
]


@pytest.mark.parametrize("encoded, expected", ENCODED)
def test_client_encoding_is_exact(encoded, expected):
    assert encoded == expected
