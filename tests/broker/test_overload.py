"""Overload slows producers down; it never fails them (issue 9, section 2).

A worker forwards publishes for topics it does not own through a ring to the owner. When the owner appends slower
than the others forward (it spills to disk, it is starved of CPU), its rings fill up. That is back-pressure: the
publish is parked with its session held (nothing more is read from that socket, so TCP pushes back on the
producer), its OK goes out once the ring took it, and meanwhile the worker serves all its other sessions. Only a
topic the owner marked full (its budgets used up) or a storage error fails a publish.

* ``test_a_parked_publish_is_answered_once_there_is_room``: the owner is stopped (SIGSTOP) so its ring fills for
  sure; a producer's pipelined MPUBs stop being answered, another session of the same worker is served meanwhile,
  and once the owner runs again every MPUB is answered OK, in order, and delivered exactly once.
* ``test_producers_faster_than_the_owner`` (``_soak`` for 60 s): four workers on this machine's cores, a small
  memory budget (the owner spills to disk), producer processes pipelining MPUBs to a topic owned by one worker:
  the other three forward faster than it appends. No error, and every acknowledged message is delivered exactly
  once, each producer's in order.

Which worker serves a connection is read from /proc (the worker process holding the accepted socket's inode).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import struct
import threading
import time
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.wire import Connection, MessageStream, fin_lines
from nsqpy.protocol import client as C
from tests.broker import namespaces
from tests.broker.wire import Conn, unique

fork = multiprocessing.get_context("fork")
BODY_HEAD = struct.Struct("<IIQ")  # producer, 0, sequence number (the rest of a body is filler)


# ---- which worker serves a connection ----------------------------------------------------------------------
def worker_serving(nsqd, sock):
    """The index of the worker whose process holds the broker's end of ``sock`` (namespaces.worker_serving)."""
    return int(namespaces.worker_serving(nsqd, SimpleNamespace(sock=sock)).split()[1])


def worker_pid(nsqd, index):
    """The pid of worker ``index``'s current process."""
    return namespaces.worker_pids(nsqd)[f"worker {index}"][0]


def nothing_arrives(conn, within):
    """Nothing but heartbeats arrives on conn within the window (no sync point: conn is held, it reads nothing)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        frame = conn.frames.pop(0) if conn.frames else None
        assert frame is None or frame == (0, b"_heartbeat_"), f"expected nothing, got {frame!r:.200}"
        assert not conn.eof, "expected the connection to stay open"
        conn._fill(deadline)
    assert not conn.frames and not conn.eof, f"expected nothing, got {conn.frames[:3]!r:.200}"


def send_all(sock, chunks, timeout=120.0):
    """Send chunks on a socket object of its own (the reading side sets its own short timeouts): the broker stops
    reading while a publish is parked, so this blocks until it reads again."""
    with sock.dup() as mine:
        mine.settimeout(timeout)
        for chunk in chunks:
            mine.sendall(chunk)


def topic_owned_by(worker, workers, prefix="o"):
    return next(t for t in (unique(prefix) for _ in range(1000)) if zlib.crc32(t.encode()) % workers == worker)


# ---- producers and the verifying consumer ------------------------------------------------------------------
def mpub_template(topic, producer, size, batch):
    """An MPUB of ``batch`` bodies of ``size`` bytes (producer id in each), and the offsets of their seq fields."""
    head = b"MPUB " + topic.encode() + b"\n"
    body_block = 4 + batch * (4 + size)
    out = bytearray(head + struct.pack(">II", body_block, batch))
    seq_at = []
    for _ in range(batch):
        out += struct.pack(">I", size)
        seq_at.append(len(out) + 8)
        out += BODY_HEAD.pack(producer, 0, 0) + b"x" * (size - BODY_HEAD.size)
    return np.frombuffer(out, np.uint8).copy(), np.array(seq_at, np.int64)


def produce(address, topic, producer, size, batch, window, seconds, report):
    """Pipeline MPUBs (``window`` unanswered at most) for ``seconds``, then wait for every answer. Reports
    (MPUBs answered OK, the first error text or None) through the pipe ``report``."""
    oks, error = 0, None
    try:
        conn = Connection(address, timeout=60)
        sock = conn.sock
        template, seq_at = mpub_template(topic, producer, size, batch)
        idx = seq_at[:, None] + np.arange(8)
        decoder = C.FrameDecoder()
        sent = 0
        stop_at = time.monotonic() + seconds
        while error is None and (time.monotonic() < stop_at or oks < sent):
            while sent - oks < window and time.monotonic() < stop_at:
                seqs = np.arange(sent * batch, (sent + 1) * batch, dtype="<u8")
                template[idx] = seqs.view(np.uint8).reshape(batch, 8)
                sock.sendall(template)
                sent += 1
            data = sock.recv(1 << 16)
            if not data:
                error = "connection closed"
                break
            for ftype, fdata in decoder.feed(data):
                if fdata == b"_heartbeat_":
                    sock.sendall(C.nop())
                elif ftype == 0 and fdata == b"OK":
                    oks += 1
                else:
                    error = fdata.decode(errors="replace")
                    break
        conn.close()
    except Exception as e:  # reported to the test, which fails on it
        error = f"{type(e).__name__}: {e}"
    report.send((oks, error))
    report.close()


def run_producers(address, topic, producers, size, batch, window, seconds):
    """-> [(MPUBs answered OK, error)] per producer process."""
    pipes, procs = [], []
    for p in range(producers):
        r, w = fork.Pipe(duplex=False)
        proc = fork.Process(target=produce, args=(address, topic, p, size, batch, window, seconds, w), daemon=True)
        proc.start()
        w.close()
        pipes.append(r)
        procs.append(proc)
    results = []
    for r, proc in zip(pipes, procs):
        assert r.poll(seconds + 120), "a producer did not report"
        results.append(r.recv())
        proc.join(30)
    return results


def consume_exactly(address, topic, expected, timeout=300.0):
    """Subscribe and FIN until ``expected`` (producer -> messages) all arrived; every one exactly once and each
    producer's in order (seq 0, 1, 2 ...). Then nothing more may arrive."""
    conn = Connection(address, timeout=60)
    conn.subscribe(topic, "check", 2500)
    stream = MessageStream(conn)
    total = sum(expected.values())
    nxt = np.zeros(max(expected) + 1, np.int64)
    got = 0
    deadline = time.monotonic() + timeout
    lanes = np.arange(16)
    while got < total:
        assert time.monotonic() < deadline, f"only {got} of {total} messages arrived"
        for batch in stream.read(1.0):
            offs = batch.body_offsets
            heads = stream.array[offs[:, None] + lanes]
            producers = heads[:, :4].copy().view("<u4")[:, 0].astype(np.int64)
            seqs = heads[:, 8:].copy().view("<u8")[:, 0].astype(np.int64)
            for p in np.unique(producers).tolist():
                s = seqs[producers == p]
                want = np.arange(nxt[p], nxt[p] + len(s))
                assert np.array_equal(s, want), f"producer {p}: expected seqs from {nxt[p]}, got {s[:5]}..."
                nxt[p] += len(s)
            got += len(offs)
            conn.send(fin_lines(stream.array, offs))
    for p, n in expected.items():
        assert nxt[p] == n, f"producer {p}: {nxt[p]} delivered, {n} acknowledged"
    extra = stream.read(0.5)
    assert not any(len(b) for b in extra), "messages beyond those acknowledged"
    conn.close()
    return got


# ---- a parked publish ----------------------------------------------------------------------------------------
def test_a_parked_publish_is_answered_once_there_is_room(nsqd_factory):
    """The owner stopped: the producer's ring fills, its MPUBs stop being answered (parked, no error), another
    session of the same worker is served meanwhile (a publish to a topic that worker owns, IDENTIFY), and a lone PUB
    to the stopped owner's topic (the pump's path) waits too; once the owner runs again every MPUB and the PUB get
    their OK, in order, and every message is delivered exactly once."""
    nsqd = nsqd_factory("--ring-budget=1048576")  # 256 KiB rings: records up to 32 KiB go through them
    conns = [Conn(nsqd.address) for _ in range(4)]
    on = {}
    for c in conns:
        on.setdefault(worker_serving(nsqd, c.sock), []).append(c)
    while len(on.get(0, [])) < 3:  # the acceptor spreads connections: a few more land on worker 0
        assert len(conns) < 40, f"the acceptor puts nothing on worker 0: {on}"
        c = Conn(nsqd.address)
        conns.append(c)
        on.setdefault(worker_serving(nsqd, c.sock), []).append(c)
    sender, owner = 0, 1
    producer, bystander, lone = on[sender][:3]
    topic = topic_owned_by(owner, 2)
    local = topic_owned_by(sender, 2, "local")
    producer.publish(topic, BODY_HEAD.pack(0, 0, 0) + b"first")
    owner_pid = worker_pid(nsqd, owner)
    # 40 MPUBs of 4 x 6000 B (~24 KiB records): four times what the 256 KiB ring holds
    mpubs = 40
    bodies = [[BODY_HEAD.pack(0, 0, 1 + 4 * k + i) + bytes(6000 - BODY_HEAD.size) for i in range(4)]
              for k in range(mpubs)]
    os.kill(owner_pid, signal.SIGSTOP)
    try:
        # the MPUBs, then an IDENTIFY whose reply (JSON) must come after every one of their OKs
        chunks = [C.mpub(topic, b) for b in bodies] + [C.identify({"feature_negotiation": True})]
        sender_thread = threading.Thread(target=send_all, args=(producer.sock, chunks))
        sender_thread.start()
        oks = 0
        while True:
            try:
                frame = producer.next_frame(timeout=2.0)
            except AssertionError:
                break  # nothing for 2 s: the ring is full and the rest is parked
            assert frame == (0, b"OK"), f"expected OK, got {frame!r:.200}"  # (the IDENTIFY's reply waits)
            oks += 1
        assert 0 < oks < mpubs, f"{oks} of {mpubs} answered while the owner was stopped"
        # the same worker still serves its other sessions
        t0 = time.monotonic()
        bystander.publish(local, b"served")
        bystander.send(C.identify({"client_id": "bystander"}))
        bystander.expect_response(b"OK")
        served_in = time.monotonic() - t0
        # a lone PUB to the same owner (the pump's compiled path) queues behind the parked MPUB: no error either
        lone.send(C.pub(topic, BODY_HEAD.pack(1, 0, 0)))
        nothing_arrives(lone, 0.5)
        nothing_arrives(producer, 0.1)  # still parked
    finally:
        os.kill(owner_pid, signal.SIGCONT)
    for _ in range(mpubs - oks):
        producer.expect_response(b"OK", timeout=60)
    kind, data = producer.expect_frame(timeout=60)
    assert kind == 0 and data.startswith(b"{"), f"expected IDENTIFY's reply last, got {data!r:.100}"
    lone.expect_response(b"OK", timeout=60)
    sender_thread.join(60)
    producer.expect_no_frame(within=0.3)  # and it reads again: its sync PUB is answered
    lone.expect_no_frame(within=0.3)
    assert served_in < 10.0, f"another session of the worker waited {served_in:.1f}s"
    for c in conns:
        c.close()
    assert consume_exactly(nsqd.address, topic, {0: 1 + 4 * mpubs, 1: 1}) == 2 + 4 * mpubs


# ---- producers faster than the owner ---------------------------------------------------------------------------
def _faster_than_the_owner(nsqd_factory, seconds):
    workers = 4
    nsqd = nsqd_factory("--mem-queue-size=100", "--max-disk-bytes-per-topic=68719476736", "--log-level=debug",
                        workers=workers)
    topic = topic_owned_by(0, workers)
    producers = 6
    results = run_producers(nsqd.address, topic, producers, size=200, batch=200, window=4, seconds=seconds)
    errors = [e for _, e in results if e]
    assert not errors, errors
    nsqd.wait_for_line(r"worker \d: worker 0 is behind", timeout=1)  # the rings did fill up
    expected = {p: oks * 200 for p, (oks, _) in enumerate(results)}
    assert all(expected.values()), expected
    assert consume_exactly(nsqd.address, topic, expected) == sum(expected.values())


def test_producers_faster_than_the_owner(nsqd_factory):
    _faster_than_the_owner(nsqd_factory, 5)


@pytest.mark.soak
def test_producers_faster_than_the_owner_soak(nsqd_factory):
    _faster_than_the_owner(nsqd_factory, 60)
