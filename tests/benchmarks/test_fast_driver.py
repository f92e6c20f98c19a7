"""bench_writer's epoll driver (`fast_writer`) and the compiled no-op sink (`fast_sink`): real processes on port 0.

* the driver against both sinks, as `bench_writer --driver=epoll` subprocesses: the counters agree with what
  the sink counted;
* the driver in this process against a scripted stub server (a forked process) that splits an OK across two
  sends with a heartbeat in front of it, coalesces an OK with a heartbeat, and sends an error frame;
* the fast sink fed a command stream one byte per send.

Nothing sleeps: every wait is on a condition (a listening line, a pipe, a socket) with a deadline.
"""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time

from nsqpy.protocol import client, commands as cmd
from nsqpy.protocol.frames import FRAME_ERROR, HEARTBEAT_FRAME, OK_FRAME, encode_frame
from nsqpy.protocol.v2_parser import V2Parser

from benchmarks import fast_writer, sink_server
from benchmarks.process import ListeningProcess, python_module, run_tool
from benchmarks.wire import Connection

RUN = ["--runfor", "1s", "--batch-size", "1"]
PUB_FAILED = encode_frame(FRAME_ERROR, b"E_PUB_FAILED stub says no")


def writer(address: str, *args: str) -> dict:
    code, result = run_tool("benchmarks.bench_writer", "--nsqd-tcp-address", address, "--driver", "epoll",
                            *args, timeout=60)
    assert code == 0, result.get("first_error")
    assert result["errors"] == 0 and result["msgs"] > 0 and result["ops_per_s"] > 0
    assert result["driver"] == "epoll"
    return result


def test_epoll_driver_against_the_fast_sink_with_its_ceiling():
    with ListeningProcess(python_module("benchmarks.sink_server", "--fast"), ready_timeout=60) as sink:
        result = writer(sink.address_text, *RUN, "--connections", "5", "--driver-processes", "2",
                        "--ceiling-runfor", "300ms")
    assert result["connections"] == 5 and result["driver_processes"] == 2 and result["batch_size"] == 1
    assert result["ceiling_ops_per_s"] > 0 and result["ceiling_errors"] == 0
    counters = sink.json_result()
    assert counters["connections"] == 5 and counters["errors"] == 0
    assert counters["msgs_in"] == result["msgs"] and counters["bytes_in"] == result["msgs"] * 200


def test_epoll_driver_mpub_against_the_python_sink():
    with ListeningProcess(python_module("benchmarks.sink_server", "--processes", "1"), ready_timeout=60) as sink:
        result = writer(sink.address_text, "--runfor", "1s", "--batch-size", "50", "--size", "100",
                        "--connections", "3", "--no-ceiling")
    assert result["driver_processes"] == 1 and result["msgs"] % 50 == 0
    counters = sink.json_result()
    assert counters["errors"] == 0 and counters["msgs_in"] == result["msgs"]
    assert counters["bytes_in"] == result["msgs"] * 100


# -- a scripted stub server ----------------------------------------------------------------------------------

def _serve_one(sock: socket.socket, script, stats: dict, lock: threading.Lock) -> None:
    """Answer IDENTIFY with OK and the n-th PUB (from 0) with script(n): (pieces to send one by one, bytes to
    hold back until the next NOP arrives), or None to close the connection."""
    parser, pubs, held = V2Parser(), 0, b""
    with sock:
        while chunk := sock.recv(65536):
            for item in parser.feed(chunk):
                if isinstance(item, cmd.Identify):
                    sock.sendall(OK_FRAME)
                elif isinstance(item, cmd.Nop):
                    with lock:
                        stats["nops"] += 1
                    sock.sendall(held)
                    held = b""
                else:
                    assert isinstance(item, cmd.Pub), item
                    answer = script(pubs)
                    pubs += 1
                    with lock:
                        stats["pubs"] += 1
                    if answer is None:
                        return
                    reply, held = answer
                    with lock:
                        stats["oks"] += (b"".join(reply) + held).count(OK_FRAME)
                    for piece in reply:
                        sock.sendall(piece)


def _stub_main(listener: socket.socket, scripts, pipe) -> None:
    stats, lock, threads = {"pubs": 0, "nops": 0, "oks": 0}, threading.Lock(), []
    for script in scripts:
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threads.append(threading.Thread(target=_serve_one, args=(sock, script, stats, lock)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    pipe.send(stats)


def split_and_coalesced(n: int):
    """(pieces sent now, bytes held back until the next NOP) for the n-th PUB."""
    if n == 0:
        return [HEARTBEAT_FRAME + OK_FRAME[:5]], OK_FRAME[5:]      # a partial OK behind a heartbeat
    if n == 1:
        return [OK_FRAME + HEARTBEAT_FRAME], b""                     # coalesced: OK and a heartbeat
    if n == 2:
        return [OK_FRAME[:3], OK_FRAME[3:9], OK_FRAME[9:]], b""      # split three ways
    return [OK_FRAME], b""


def fails_at_the_fourth(n: int):
    return ([PUB_FAILED] if n == 3 else [OK_FRAME]), b""


def always_ok(n: int):
    return [OK_FRAME], b""


def drive_stub(scripts, runfor: float = 0.5) -> tuple[dict, dict]:
    """Run the driver for `runfor` against a forked stub serving one connection per script; (driver's
    counters, stub's stats)."""
    listener = socket.create_server(("127.0.0.1", 0))
    ours, theirs = multiprocessing.Pipe()
    stub = multiprocessing.get_context("fork").Process(target=_stub_main, args=(listener, scripts, theirs),
                                                       daemon=True)
    stub.start()
    try:
        conns = [Connection(listener.getsockname()) for _ in scripts]
        out = fast_writer.publish([conn.sock for conn in conns], client.pub("t", b"x" * 10), 1,
                                  time.monotonic() + runfor)
        for conn in conns:
            conn.close()
        assert ours.poll(20), "the stub did not report"
        return out, ours.recv()
    finally:
        stub.kill()
        stub.join()
        listener.close()


def test_split_and_coalesced_frames_and_heartbeats():
    out, stats = drive_stub([split_and_coalesced])
    assert out["errors"] == 0 and out["unanswered"] == 0, out
    assert out["nops"] == stats["nops"] == 2
    assert out["msgs"] == stats["oks"] == stats["pubs"] > 3


def test_an_error_frame_counts_an_error_and_stops_only_that_connection():
    out, stats = drive_stub([fails_at_the_fourth, always_ok])
    assert out["errors"] == 1 and out["error_text"] == "E_PUB_FAILED stub says no"
    assert out["msgs"] == stats["oks"] > 3 + 100   # the other connection went on
    assert stats["pubs"] == stats["oks"] + 1


def closes_at_the_sixth(n: int):
    return None if n == 5 else ([OK_FRAME], b"")


def test_a_connection_closed_by_the_server_is_an_error():
    out, stats = drive_stub([closes_at_the_sixth], runfor=10.0)
    assert out["errors"] == 1 and out["error_text"] == "connection closed by the server"
    assert out["msgs"] == stats["oks"] == 5 and stats["pubs"] == 6


def test_fast_sink_parses_a_stream_sent_one_byte_at_a_time():
    server = sink_server.start(fast=True)
    try:
        with socket.create_connection(server.address, timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            stream = (client.magic() + client.identify({"feature_negotiation": False}) + client.pub("t", b"hello")
                      + client.mpub("t", [b"a", b"bc"]) + client.nop() + client.dpub("t", 100, b"later\r\n"))
            for i in range(len(stream)):
                sock.sendall(stream[i:i + 1])
            assert _read_exactly(sock, 4 * len(OK_FRAME)) == OK_FRAME * 4
            sock.sendall(client.sub("t", "c"))
            reply = _read_to_eof(sock)
            assert int.from_bytes(reply[:4], "big") == len(reply) - 4
            assert int.from_bytes(reply[4:8], "big") == FRAME_ERROR and reply[8:].startswith(b"E_INVALID ")
    finally:
        counters = server.stop()
    assert counters["connections"] == 1 and counters["errors"] == 1
    assert counters["msgs_in"] == 4 and counters["bytes_in"] == 5 + 3 + 7
    assert counters["commands"] == 5   # IDENTIFY, PUB, MPUB, NOP, DPUB


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"EOF after {data!r}"
        data += chunk
    return data


def _read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data
