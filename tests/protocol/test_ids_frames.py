"""Message IDs and single frames as exact bytes."""

import numpy as np
import pytest

from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.frames import (
    CLOSE_WAIT_FRAME, HEARTBEAT_FRAME, OK_FRAME, encode_frame, message_frame, response_frame)
from nsqpy.protocol.ids import TWEPOCH, IdGenerator, hex_to_id, id_to_hex, snowflake


def test_reply_frames():
    assert OK_FRAME == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert HEARTBEAT_FRAME == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    assert CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"
    assert response_frame(b"{}") == encode_frame(0, b"{}") == b"\x00\x00\x00\x06\x00\x00\x00\x00{}"
    assert ProtocolError("invalid command FOO").frame() == b"\x00\x00\x00\x21\x00\x00\x00\x01E_INVALID invalid command FOO"


def test_message_frame():
    frame = message_frame(0x0102030405060708, 3, b"0123456789abcdef", b"body")
    assert frame == (b"\x00\x00\x00\x22\x00\x00\x00\x02" + b"\x01\x02\x03\x04\x05\x06\x07\x08" + b"\x00\x03"
                     + b"0123456789abcdef" + b"body")
    with pytest.raises(ValueError):
        message_frame(0, 1, b"short", b"")


def test_id_hex():
    assert id_to_hex(0) == b"0000000000000000"
    assert id_to_hex(0x0123456789ABCDEF) == b"0123456789abcdef"
    assert hex_to_id(b"0123456789abcdef") == 0x0123456789ABCDEF
    assert hex_to_id(b"0123456789ABCDEF") is None and hex_to_id(b"0123") is None and hex_to_id(b"g" * 16) is None


def test_snowflake_formula():
    now = (TWEPOCH + 5) << 20
    assert snowflake(now, 7, 9) == 5 << 22 | 7 << 12 | 9
    assert snowflake(now + (1 << 20) - 1, 1023, 4096 + 2) == 5 << 22 | 1023 << 12 | 2


def test_generator_is_unique_increasing_and_batch_equals_single():
    now = 1_700_000_000 * 10**9
    single, batch = IdGenerator(3), IdGenerator(3)
    ids_single = [single.next_id(now) for _ in range(9000)]  # > 4096 in one tick: borrows the next ticks
    ids_batch = batch.next_ids(9000, now).tolist()
    assert ids_single == ids_batch
    assert ids_single == sorted(set(ids_single))
    assert ids_single[0] == snowflake(now, 3, 0)
    earlier = single.next_id(now - 10**9)  # the clock went back: still increasing
    assert earlier > ids_single[-1]
    assert batch.next_ids(3, now - 10**9).dtype == np.uint64
    with pytest.raises(ValueError):
        IdGenerator(1024)
