"""The error catalogue (spec 1.5) and the state table (spec 1.3/1.4) as tables."""

import struct

import pytest

from codec_helpers import ID, parse
from nsqpy.protocol import errors as e
from nsqpy.protocol.states import (
    ALLOWED_STATES, ANY_STATE, STATE_CLOSING, STATE_CONNECTED, STATE_DISCONNECTED, STATE_INIT, STATE_SUBSCRIBED,
    check_state)

CATALOGUE = [
    (e.BadProtocol, "E_BAD_PROTOCOL", True), (e.Invalid, "E_INVALID", True), (e.BadBody, "E_BAD_BODY", True),
    (e.BadTopic, "E_BAD_TOPIC", True), (e.BadChannel, "E_BAD_CHANNEL", True),
    (e.BadMessage, "E_BAD_MESSAGE", True), (e.PubFailed, "E_PUB_FAILED", True),
    (e.MpubFailed, "E_MPUB_FAILED", True), (e.DpubFailed, "E_DPUB_FAILED", True),
    (e.SubFailed, "E_SUB_FAILED", True), (e.IdentifyFailed, "E_IDENTIFY_FAILED", True),
    (e.TooManyChannelConsumers, "E_TOO_MANY_CHANNEL_CONSUMERS", True),
    (e.AuthDisabled, "E_AUTH_DISABLED", True), (e.AuthFailed, "E_AUTH_FAILED", True),
    (e.AuthFirst, "E_AUTH_FIRST", True), (e.Unauthorized, "E_UNAUTHORIZED", True),
    (e.AuthError, "E_AUTH_ERROR", True),
    (e.FinFailed, "E_FIN_FAILED", False), (e.ReqFailed, "E_REQ_FAILED", False),
    (e.TouchFailed, "E_TOUCH_FAILED", False),
]


@pytest.mark.parametrize("cls, code, fatal", CATALOGUE)
def test_catalogue(cls, code, fatal):
    err = cls("some text")
    assert (err.code, err.fatal) == (code, fatal) and isinstance(err, e.ProtocolError)
    assert err.frame() == struct.pack(">ii", len(code) + 14, 1) + code.encode() + b" some text"
    assert e.ERROR_CLASSES[code] is cls


def test_catalogue_is_complete():
    assert set(e.ERROR_CLASSES) == {code for _, code, _ in CATALOGUE}


BROKER_TEXTS = [
    (e.FinFailed(f"FIN {ID.decode()} failed ID not in flight"),
     b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight", False),
    (e.ReqFailed(f"REQ {ID.decode()} failed client does not own message"),
     b"E_REQ_FAILED REQ 0123456789abcdef failed client does not own message", False),
    (e.Invalid("cannot SUB with heartbeats disabled"), b"E_INVALID cannot SUB with heartbeats disabled", True),
    (e.Invalid("cannot PUB in current state (TLS required)"),
     b"E_INVALID cannot PUB in current state (TLS required)", True),
    (e.AuthFirst("AUTH required before PUB"), b"E_AUTH_FIRST AUTH required before PUB", True),
    (e.BadProtocol(), b"E_BAD_PROTOCOL", True),
]


@pytest.mark.parametrize("err, data, fatal", BROKER_TEXTS)
def test_broker_side_error_texts(err, data, fatal):
    assert err.data() == data and err.fatal is fatal


def test_go_quote():
    assert e.go_quote(b"x!") == '"x!"'
    assert e.go_quote(b'a"b\\c\n\t\x00\xff') == '"a\\"b\\\\c\\n\\t\\x00\\xff"'
    assert e.go_quote("é".encode()) == '"é"'


STATE_TABLE = {
    "IDENTIFY": {STATE_INIT}, "AUTH": {STATE_INIT}, "SUB": {STATE_INIT},
    "PUB": set(ANY_STATE), "MPUB": set(ANY_STATE), "DPUB": set(ANY_STATE), "NOP": set(ANY_STATE),
    "RDY": {STATE_SUBSCRIBED}, "CLS": {STATE_SUBSCRIBED},
    "FIN": {STATE_SUBSCRIBED, STATE_CLOSING}, "REQ": {STATE_SUBSCRIBED, STATE_CLOSING},
    "TOUCH": {STATE_SUBSCRIBED, STATE_CLOSING},
}


def test_state_table():
    assert {verb: set(states) for verb, states in ALLOWED_STATES.items()} == STATE_TABLE
    assert (STATE_INIT, STATE_DISCONNECTED, STATE_CONNECTED, STATE_SUBSCRIBED, STATE_CLOSING) == (0, 1, 2, 3, 4)


@pytest.mark.parametrize("verb", sorted(STATE_TABLE))
@pytest.mark.parametrize("state", sorted(ANY_STATE))
def test_check_state(verb, state):
    err = check_state(verb, state)
    if state in STATE_TABLE[verb]:
        assert err is None
    else:
        assert err.data() == f"E_INVALID cannot {verb} in current state".encode() and err.fatal


LINES = {"IDENTIFY": b"IDENTIFY\n", "AUTH": b"AUTH\n", "SUB": b"SUB t c\n", "RDY": b"RDY 1\n",
         "FIN": b"FIN " + ID + b"\n", "REQ": b"REQ " + ID + b" 0\n", "TOUCH": b"TOUCH " + ID + b"\n",
         "CLS": b"CLS\n"}


@pytest.mark.parametrize("verb", sorted(LINES))
@pytest.mark.parametrize("state", [STATE_INIT, STATE_SUBSCRIBED, STATE_CLOSING])
def test_parser_applies_state_table(verb, state):
    out = parse(LINES[verb], state)
    if verb == "RDY" and state == STATE_CLOSING:
        assert out == []  # ignored silently
    elif state in STATE_TABLE[verb]:
        assert not out or not isinstance(out[-1], e.ProtocolError)
    else:
        assert out[-1].description == f"cannot {verb} in current state"
