"""SIGKILL the log's owner at random moments, again and again: whatever it reported committed must be there once,
intact, and every batch must be all or nothing.

A child process attaches, recovers, appends batches of 1..4 checksummed, sequence-numbered records (1 B .. 64 KiB,
mostly small) and reports each batch through a pipe once ``append_batch`` returned. The parent kills it after a
random number of reports (sometimes before it even finished recovering) and starts the next one. Finally the
parent recovers as the owner and reads everything back through a channel (the first channel takes the backlog)."""
import mmap
import os
import random
import select
import signal
import struct
import zlib

import numpy as np

from nsqpy.ipc.filesegment import FileSegmentProvider
from nsqpy.ipc.msglog import LogFull, MessageLog, ShmSegmentProvider, log_ctrl_nbytes

SEG = 1 << 20
MEM, DISK = 4 * SEG, 28 * SEG  # the memory tier fills early, so recovery also covers file segments
ROUNDS = 60
REPORT = struct.Struct("<qq")  # first seq, last seq of a committed batch; (0, 0) = recovered and ready
DEADLINE = 60.0


def body_of(seq: int) -> bytes:
    rng = random.Random(seq)
    size = rng.randint(1, 200) if rng.random() < 0.9 else rng.randint(1, 64 * 1024)
    return rng.randbytes(size)


def providers(prefix, directory):
    return ShmSegmentProvider(prefix), FileSegmentProvider(directory, "crash")


def child(ctrl, prefix, directory, wfd):
    code = 1
    try:
        log = MessageLog.attach(ctrl, 0, *providers(prefix, directory))
        log.recover()
        seq = log.last_id + 1
        os.write(wfd, REPORT.pack(0, 0))
        rng = random.Random(os.getpid())
        while True:
            bodies = [body_of(seq + i) for i in range(rng.randint(1, 4))]
            n = len(bodies)
            lengths = np.array([len(b) for b in bodies], dtype=np.int64)
            offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
            ids = np.arange(seq, seq + n, dtype=np.int64)
            crcs = np.array([zlib.crc32(b) for b in bodies], dtype=np.int64)
            batch = np.full(n, seq * 16 + n, dtype=np.int64)  # not-before carries the batch: first seq, size
            try:
                log.append_batch(np.frombuffer(b"".join(bodies), np.uint8), offsets, lengths, crcs, ids, batch)
            except LogFull:
                code = 3
                return
            os.write(wfd, REPORT.pack(seq, seq + n - 1))
            seq += n
    finally:
        os._exit(code)


def run_round(ctrl, prefix, directory, rng):
    """One owner's life: returns (reported batches, whether it stopped because the log was full)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        child(ctrl, prefix, directory, wfd)
    os.close(wfd)
    kill_after = -1 if rng.random() < 0.1 else rng.randint(0, 40)  # -1: kill at once, maybe mid-recovery
    reports, buf = [], b""
    try:
        while len(reports) <= kill_after:
            ready, _, _ = select.select([rfd], [], [], DEADLINE)
            assert ready, "child stopped reporting"
            chunk = os.read(rfd, 4096)
            if not chunk:
                break
            buf += chunk
            while len(buf) >= REPORT.size:
                reports.append(REPORT.unpack(buf[:REPORT.size]))
                buf = buf[REPORT.size:]
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        while chunk := os.read(rfd, 4096):  # reports written before the kill are committed too
            buf += chunk
    finally:
        os.close(rfd)
    reports += [REPORT.unpack(buf[k:k + REPORT.size]) for k in range(0, len(buf) - len(buf) % REPORT.size,
                                                                           REPORT.size)]
    full = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3
    assert full or os.WIFSIGNALED(status), f"child failed: status {status}"
    return [r for r in reports if r != (0, 0)], full


def warm_up(prefix, directory):
    """Compile every kernel the children use in this process, so that forked children start at once."""
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(SEG, MEM, DISK))
    log = MessageLog.create(ctrl, 0, segment_size=SEG, mem_bytes=MEM, disk_bytes=DISK,
                            memory=ShmSegmentProvider(prefix + "w"), disk=FileSegmentProvider(directory, "warm"))
    one = np.ones(1, dtype=np.int64)
    log.append_batch(np.zeros(1, np.uint8), one * 0, one, one, one, one)
    log.close()
    log = MessageLog.attach(ctrl, 0, ShmSegmentProvider(prefix + "w"), FileSegmentProvider(directory, "warm"))
    log.recover()
    log.destroy()


def test_sigkill_never_loses_a_committed_record(shm_prefix, tmp_path):
    directory = str(tmp_path)
    warm_up(shm_prefix, directory)
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(SEG, MEM, DISK))
    log = MessageLog.create(ctrl, 0, segment_size=SEG, mem_bytes=MEM, disk_bytes=DISK,
                            memory=ShmSegmentProvider(shm_prefix), disk=FileSegmentProvider(directory, "crash"))
    log.close()
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    committed, kills = set(), 0
    for _ in range(ROUNDS):
        reports, full = run_round(ctrl, shm_prefix, directory, rng)
        kills += not full
        for first, last in reports:
            committed.update(range(first, last + 1))
        if full:
            break
    assert kills >= 50

    log = MessageLog.attach(ctrl, 0, *providers(shm_prefix, directory))
    try:
        log.recover()
        ch = log.open_channel()
        seen, batches = [], {}
        while True:
            b = log.read(ch, 1000, 64 << 20)
            if b.n == 0:
                break
            for i in range(b.n):
                seq, pos = int(b.ids[i]), int(b.positions[i])
                body = log.body(pos)
                assert body == body_of(seq) and zlib.crc32(body) == b.timestamps[i], f"record {seq} damaged"
                seen.append(seq)
                batches.setdefault(int(b.not_before[i]), []).append(seq)
            log.advance(ch, b.next_position)
        assert seen == sorted(set(seen)), "a record appears twice or out of order"
        assert committed <= set(seen), f"lost committed records: {sorted(committed - set(seen))[:10]}"
        for key, seqs in batches.items():  # all or nothing, even when the owner died inside append_batch
            assert seqs == list(range(key // 16, key // 16 + key % 16)), f"torn batch {seqs}"
        assert log.last_id == max(seen) and log.depth(ch) == 0
        print(f"{kills} kills, {len(committed)} records reported committed, {len(seen)} present, "
              f"segments {log.segments()}")
    finally:
        log.destroy()
    assert not os.listdir(directory)
