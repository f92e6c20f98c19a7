"""The lane's shared words (workers/lane/words.py) and its one FORWARD encoder (records.write_forward).

* Every block's offsets are distinct and inside the block's size, so no two words share a slot, and the own path's
  areas (rows, scratch, FINs, round words) follow each other without overlap.
* The forward lane's FORWARD record is byte for byte what the Python path's ``pack_forward`` makes of the same
  bodies (the same encoder writes both), timestamp aside.
"""
import re
from pathlib import Path

import numpy as np

from nsqpy.protocol import client as C
from nsqpy.protocol.frames import OK_FRAME
from nsqpy.workers.lane import words as W
from nsqpy.workers.lane.fastlane import LaneRig
from nsqpy.workers.publishing.records import pack_forward

from test_fastlane import add_client, recv_exactly, records

BLOCKS = {  # prefix of a block's offsets -> its size (a word count, or a block's rows)
    "ST_": W.ST_ROWS, "OUT_": W.OUT_ROWS, "RES_": W.RES_WORDS, "SW_": W.SW_ROWS, "RG_": W.RG_ROWS,
    "TP_": W.TP_ROWS, "RD_": W.ROUND_WORDS, "RI_": W.RI_ROWS,
}


def _offsets(prefix, skip=()):
    return {name: v for name, v in vars(W).items()
            if name.startswith(prefix) and isinstance(v, int) and name not in skip}


def test_every_block_has_distinct_offsets_inside_it():
    for prefix, size in BLOCKS.items():
        found = _offsets(prefix, skip={prefix + "ROWS", "RES_WORDS", "RD_AT"})
        assert found, prefix
        assert sorted(found.values()) == list(range(size)), (prefix, found)
    pump_words = {**_offsets("CN_"), **_offsets("PW_")}
    assert sorted(pump_words.values()) == list(range(W.PUMP_WORDS))
    lane = {**_offsets("RES_", skip={"RES_WORDS"}), **_offsets("LN_")}
    assert sorted(lane.values()) == list(range(W.LANE_WORDS))
    ints = [W.FD_GEN, W.FD_TALLY, W.FD_TALLY_TOPIC, W.FD_STREAK, W.FD_STREAK_OWNER]
    assert sorted(ints) == list(range(W.FD_INT_ROWS))
    assert sorted([W.FD_CLEAN, W.FD_BUSY, W.FD_MOVED_IN, W.FD_STAY_OUT]) == list(range(W.FD_FLAG_ROWS))
    times = [W.FD_LAST_READ, W.FD_STREAK_T0, W.FD_TOOK_BEFORE, W.FD_BEST_SINCE, W.FD_WATCHED]
    assert sorted(times) == list(range(W.FD_TIME_ROWS))


def test_the_own_paths_areas_follow_each_other():
    head = _offsets("OW_", skip={"OW_WORDS"})
    assert sorted(head.values()) == list(range(W.HEAD))
    assert sorted(_offsets("RW_").values()) == list(range(W.ROW))  # a row's words
    areas = [(W.ROWS_AT, W.MAX_ROWS * W.ROW), (W.A_TS, W.MAX_N), (W.A_IDS, W.MAX_N), (W.A_NB, W.MAX_N),
             (W.READ_AT, 7 * W.MAX_N), (W.SLOTS_AT, W.MAX_ROWS * W.MAX_N), (W.FN_ROW, W.MAX_FINS),
             (W.FN_SLOT, W.MAX_FINS), (W.FN_ID, 1), (W.FN_STATUS, 1), (W.FN_FREED, 1), (W.RD_AT, W.ROUND_WORDS),
             (W.DR_OFF, W.MAX_N), (W.DR_LEN, W.MAX_N)]
    at = W.HEAD
    for start, size in areas:
        assert start == at, (start, at)
        at += size
    assert at == W.OW_WORDS and W.A_POS == W.READ_AT  # A_POS: an empty slice


def test_the_words_module_is_the_only_place_defining_the_lanes_offsets():
    lane = Path(W.__file__).parent
    defining = re.compile(r"^(OW|RW|FN|ST|OUT|RES|CN|PW|FD|TP|SW|LN|RG|RD)_[A-Z0-9_]+\s*(,|=)", re.M)
    for path in sorted(lane.glob("*.py")):
        if path.name != "words.py":
            assert not defining.search(path.read_text()), path.name


def test_the_lanes_forward_record_is_the_python_paths_payload():
    rig = LaneRig()
    socks = []
    try:
        rig.pump.learn_topic("theirs", 1)
        peer, there = add_client(rig.pump, socks)
        bodies = [b"one", b"two!", b"three" * 3]  # 66 in all: a batch producer's MPUB (>= BATCH), the lane's
        there.sendall(C.mpub("theirs", bodies * 22))
        assert rig.lane.poll(30.0) == []
        assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
        [(_, payload)] = records(rig.ring)
        src = np.frombuffer(b"".join(bodies * 22), np.uint8)
        lengths = np.array([len(b) for b in bodies * 22], np.int64)
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        ts = int.from_bytes(payload[8:16], "little")
        expected = pack_forward(np.empty(len(payload) + 64, np.uint8), b"theirs", src, offsets, lengths, ts, 0)
        assert payload == expected.tobytes()
    finally:
        rig.close()
        for s in socks:
            s.close()
