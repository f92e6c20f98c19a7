"""Message log micro-benchmark: appends/s and V2 frames written/s for 200-byte messages, one JSON line.

Appends go in batches of 200 (an MPUB of bench_writer's shape) and one at a time; delivery reads up to 200
records for one channel, frames them into an output buffer and advances the cursor (the broker's hot path).

    python -m benchmarks.msglog_bench [--out FILE]
"""
import argparse
import mmap
import os
import time

import numpy as np

from nsqpy.ipc.msglog import MessageLog, ShmSegmentProvider, log_ctrl_nbytes

from benchmarks.common import emit, environment

SEG, MEM, BODY, BATCH, TOTAL = 8 << 20, 512 << 20, 200, 200, 1_000_000


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(SEG, MEM))
    log = MessageLog.create(ctrl, 0, segment_size=SEG, mem_bytes=MEM,
                            memory=ShmSegmentProvider(f"nsqpy-bench-{os.getpid()}"))
    try:
        ch = log.open_channel()
        src = np.frombuffer(os.urandom(BODY * BATCH), dtype=np.uint8)
        offsets = np.arange(BATCH, dtype=np.int64) * BODY
        lengths = np.full(BATCH, BODY, dtype=np.int64)
        ts = np.full(BATCH, time.time_ns(), dtype=np.int64)
        ids = np.arange(BATCH, dtype=np.int64)
        log.append_batch(src, offsets, lengths, ts, ids)  # compile / warm
        t0 = time.perf_counter()
        for _ in range(TOTAL // BATCH):
            log.append_batch(src, offsets, lengths, ts, ids)
        batch_rate = TOTAL / (time.perf_counter() - t0)
        body = bytes(BODY)
        singles = 100_000
        t0 = time.perf_counter()
        for i in range(singles):
            log.append(body, i, i)
        single_rate = singles / (time.perf_counter() - t0)
        out = np.zeros(BATCH * (BODY + 64), dtype=np.uint8)
        attempts = np.ones(BATCH, dtype=np.int64)
        framed = 0
        t0 = time.perf_counter()
        while framed < TOTAL:
            b = log.read(ch, BATCH, out.size)
            log.write_frames(out, 0, b.positions, attempts, b.n)
            log.advance(ch, b.next_position)
            framed += b.n
        frame_rate = framed / (time.perf_counter() - t0)
        emit({"tool": "msglog_bench", **environment(), "body_bytes": BODY, "batch": BATCH,
              "appends_per_s_batched": round(batch_rate), "appends_per_s_single": round(single_rate),
              "frames_per_s_read_frame_advance": round(frame_rate)}, args.out)
    finally:
        log.destroy()


if __name__ == "__main__":
    main()
