"""Codec throughput on one core: MPUB messages parsed/s, FIN lines parsed/s, message frames encoded/s.

Prints exactly one JSON line (and writes it to --out FILE too). The warm-up, which includes numba's compile
(or cache load) time, is timed separately and excluded from the rates.
Run: python -m benchmarks.codec_bench [--seconds 1.0] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from nsqpy.protocol import V2Parser
from nsqpy.protocol import client
from nsqpy.protocol.frames import frame_message_batch, message_frame_size
from nsqpy.protocol.states import STATE_SUBSCRIBED

from benchmarks.common import emit, environment

MPUB_MESSAGES, MPUB_BODY = 200, 200
FIN_LINES = 4000
FRAME_BATCH, FRAME_BODY = 500, 200


def rate(fn, seconds: float) -> float:
    """Items per second of `fn()` (which returns how many items it handled), over about `seconds`."""
    items = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(20):
            items += fn()
        now = time.perf_counter()
        if now >= deadline:
            return items / (now - start)


def mpub_case():
    data = client.mpub("bench", [bytes([i % 256]) * MPUB_BODY for i in range(MPUB_MESSAGES)])
    parser = V2Parser(expect_magic=False)

    def run():
        [cmd] = parser.feed(data)
        return len(cmd)
    return run


def fin_case():
    data = b"".join(client.fin(b"%016x" % i) for i in range(FIN_LINES))
    parser = V2Parser(expect_magic=False, state=STATE_SUBSCRIBED)

    def run():
        [batch] = parser.feed(data)
        return len(batch)
    return run


def frame_case():
    src = np.frombuffer(os.urandom(FRAME_BATCH * FRAME_BODY), dtype=np.uint8)
    offsets = np.arange(FRAME_BATCH, dtype=np.int64) * FRAME_BODY
    lengths = np.full(FRAME_BATCH, FRAME_BODY, dtype=np.int64)
    timestamps = np.full(FRAME_BATCH, time.time_ns(), dtype=np.int64)
    attempts = np.ones(FRAME_BATCH, dtype=np.uint16)
    ids = np.arange(FRAME_BATCH, dtype=np.uint64) + np.uint64(1 << 40)
    out = np.empty(FRAME_BATCH * message_frame_size(FRAME_BODY), dtype=np.uint8)

    def run():
        written = frame_message_batch(out, 0, timestamps, attempts, ids, src, offsets, lengths)
        assert written == len(out)
        return FRAME_BATCH
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="measuring time per case")
    ap.add_argument("--out", help="also write the JSON line to this file")
    args = ap.parse_args()

    cases = {"mpub_msgs_per_s": mpub_case(), "fin_lines_per_s": fin_case(), "frames_per_s": frame_case()}
    t0 = time.perf_counter()
    for run in cases.values():
        run()  # first call compiles or loads each kernel from numba's cache
    warmup_s = time.perf_counter() - t0
    for run in cases.values():
        for _ in range(50):
            run()
    result = {"tool": "codec_bench", **environment()}
    result.update({name: round(rate(run, args.seconds)) for name, run in cases.items()})
    result.update({
        "numba_compile_or_cache_load_s": round(warmup_s, 3),
        "mpub_shape": f"{MPUB_MESSAGES}x{MPUB_BODY}B", "fin_lines_per_feed": FIN_LINES,
        "frames_per_batch": FRAME_BATCH, "frame_body_bytes": FRAME_BODY,
        "targets": {"mpub_msgs_per_s": 5_000_000, "fin_lines_per_s": 2_000_000, "frames_per_s": 2_000_000},
    })
    emit(result, args.out)


if __name__ == "__main__":
    main()
