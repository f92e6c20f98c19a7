"""The broker's compiled recognisers of a lone PUB or MPUB (nsqpy/protocol/v2_recognisers.py) held to the parser's
byte tables (test_v2_parser_table.py): every row they accept, the parser reads as that one command, with the same
topic and bodies; rows that are not the plainest whole PUB or MPUB they decline; and ``short_by`` asks for
exactly the rest of a command it has the size of, and for nothing otherwise.

The recognisers do not check names (the pump stages a read only for a topic name the parser let through before), so
a row they accept with bytes that are no valid name (``x!``, ``t\r``) is the parser's, whatever it makes of it.
Generated input, with the pump's topic table, is tests/broker/test_pump.py's.
"""
import numpy as np
import pytest

from codec_helpers import parse
from nsqpy.protocol import Limits, Mpub, Pub
from nsqpy.protocol.client import mpub, nop, pub
from nsqpy.protocol.names import is_valid_name
from nsqpy.protocol.v2_recognisers import lone_mpub_line, lone_pub_line, short_by
from test_v2_parser_table import ERRORS, PARSED, i32, mpub_body

LIMITS = Limits()
SMALL = dict(max_msg_size=10, max_body_size=40)  # rows over these limits, and the recognisers given the same

# The parser's rows, and rows at the recognisers' own edges (limits, lengths, what follows a command).
EXTRA = [
    pub("t", b"x" * 10), pub("t", b"x" * 11), pub("a" * 64, b"x"), pub("t", b"x") + nop(), pub("t", b"x")[:-1],
    b"PUB t\r\n" + i32(1) + b"x", b"PUB t extra\n" + i32(1) + b"x", b"PUB x!\n" + i32(1) + b"x",
    b"PUB t\n" + i32(2) + b"x", b"PUB \n" + i32(1) + b"x", b"PUB " + b"a" * 65 + b"\n" + i32(1) + b"x",
    mpub("t", [b"a"]), mpub("t", [b"a", b"bc", b"d" * 10]), mpub("t", [b"d" * 11]), mpub("t", [b"a"]) + nop(),
    mpub("t", [b"a"])[:-1], mpub("t", [b"a", b""]), mpub("t", []), b"MPUB x!\n" + mpub_body(b"a"),
    b"MPUB t\n" + mpub_body(b"ab", size=1) + b"NOP\n", b"MPUB t\n" + mpub_body(b"a", b"b", count=1),
    b"MPUB t\r\n" + mpub_body(b"a"), b"MPUB t\n" + mpub_body(*[b"x" * 10] * 4),
]
ROWS = [data for _, data, _ in PARSED] + [data for _, data, _, _ in ERRORS] + EXTRA
CASES = [(data, limits) for data in ROWS for limits in ({}, SMALL)]

# The rows they must take: the plainest whole PUB or MPUB (name aside), within the limits given.
TAKEN_PUB = {b"PUB t\n" + i32(3) + b"a\nb", b"PUB t\n" + i32(1) + b"x", pub("t", b"x" * 10), pub("t", b"x" * 11),
             pub("a" * 64, b"x"), b"PUB x!\n" + i32(1) + b"x"}
TAKEN_MPUB = {b"MPUB t\n" + mpub_body(b"a", b"bb"), mpub("t", [b"a"]), mpub("t", [b"a", b"bc", b"d" * 10]),
              mpub("t", [b"d" * 11]), b"MPUB x!\n" + mpub_body(b"a"), b"MPUB t\n" + mpub_body(*[b"x" * 10] * 4)}


def _u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8).copy()


def _limits(limits: dict) -> Limits:
    return Limits(**limits) if limits else LIMITS


def _unnamed(data: bytes, nl: int, verb: bytes) -> bool:
    """The bytes before the "\n" are no name NSQ allows, so no name of the pump's table: never staged."""
    return not is_valid_name(data[len(verb):nl].decode("latin-1"))


@pytest.mark.parametrize("data, limits", CASES)
def test_a_pub_taken_is_that_one_pub_to_the_parser(data, limits):
    lim = _limits(limits)
    nl = lone_pub_line(_u8(data), 0, len(data), lim.max_msg_size)
    got = parse(data, **limits)
    if nl < 0:
        assert data not in TAKEN_PUB or lim.max_msg_size < len(data) - data.index(b"\n") - 5
        return
    if _unnamed(data, nl, b"PUB "):
        return  # no topic of the pump's table: the parser's, whatever it makes of it (E_BAD_TOPIC, "t\r" as "t")
    assert got == [Pub(data[4:nl].decode(), data[nl + 5:])]
    assert data in TAKEN_PUB


@pytest.mark.parametrize("data, limits", CASES)
def test_an_mpub_taken_is_that_one_mpub_to_the_parser(data, limits):
    lim = _limits(limits)
    nl, n = lone_mpub_line(_u8(data), 0, len(data), lim.max_msg_size, lim.max_body_size)
    got = parse(data, **limits)
    if nl < 0:
        assert n == 0
        assert data not in TAKEN_MPUB or limits  # only a limit of SMALL's declines a row of TAKEN_MPUB
        return
    if _unnamed(data, nl, b"MPUB "):
        return  # no topic of the pump's table: the parser's, whatever it makes of it (E_BAD_TOPIC, "t\r" as "t")
    assert len(got) == 1 and isinstance(got[0], Mpub) and got[0].topic == data[5:nl].decode()
    assert len(got[0]) == n and b"".join(i32(len(b)) + b for b in got[0].bodies()) == data[nl + 9:]
    assert data in TAKEN_MPUB


def test_the_rows_to_take_are_taken_within_the_defaults():
    for data in TAKEN_PUB:
        assert lone_pub_line(_u8(data), 0, len(data), LIMITS.max_msg_size) == data.index(b"\n")
    for data in TAKEN_MPUB:
        got = lone_mpub_line(_u8(data), 0, len(data), LIMITS.max_msg_size, LIMITS.max_body_size)
        assert got[0] == data.index(b"\n") and got[1] > 0


def test_a_recogniser_reads_at_an_offset_and_only_the_bytes_it_is_given():
    data = pub("t", b"x")
    buf = _u8(b"junk" + data + b"NOP\n")
    assert lone_pub_line(buf, 4, len(data), LIMITS.max_msg_size) == data.index(b"\n")
    assert lone_pub_line(buf, 4, len(data) + 4, LIMITS.max_msg_size) == -1
    data = mpub("t", [b"a", b"b"])
    buf = _u8(b"junk" + data + b"NOP\n")
    assert lone_mpub_line(buf, 4, len(data), LIMITS.max_msg_size, LIMITS.max_body_size) == (data.index(b"\n"), 2)


@pytest.mark.parametrize("data", sorted(TAKEN_PUB | TAKEN_MPUB))
def test_short_by_asks_for_exactly_the_rest_once_it_has_the_size(data):
    size_end = data.index(b"\n") + 5
    for cut in range(len(data) + 1):
        assert short_by(_u8(data[:cut]), 0, cut) == (len(data) - cut if cut >= size_end else 0), cut


@pytest.mark.parametrize("data", sorted({d for d in ROWS if not d.startswith((b"PUB ", b"MPUB "))}))
def test_short_by_asks_nothing_of_other_commands(data):
    for cut in range(len(data) + 1):
        assert short_by(_u8(data[:cut]), 0, cut) == 0, cut
