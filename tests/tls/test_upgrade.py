"""TLS, snappy and deflate on the V2 protocol (issue 13): the upgrade sequence, every combination publishing and
consuming on topics owned by the worker that did not accept the connection, large messages, bad input."""
from __future__ import annotations

import os
import zlib

import pytest

from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_RESPONSE
from tests.broker.wire import Conn, unique
from tests.tls.securewire import SecureConn, secure

COMBOS = {"plain": {}, "snappy": {"snappy_on": True}, "deflate": {"deflate": True}, "tls": {"tls": True},
          "tls+snappy": {"tls": True, "snappy_on": True}, "tls+deflate": {"tls": True, "deflate": True}}


@pytest.fixture(scope="module")
def broker(module_nsqd_factory, certs):
    return module_nsqd_factory(*certs["flags"])


def _open(broker, client_tls, combo, **fields):
    kw = dict(COMBOS[combo])
    if kw.pop("tls", False):
        kw["tls"] = client_tls
    return secure(broker.address, **kw, **fields)


@pytest.mark.parametrize("combo", list(COMBOS))
def test_publish_and_consume_on_every_worker(broker, client_tls, combo):
    """Several topics, so that each worker owns some: a consumer accepted anywhere is handed to the owner with
    its relay staying behind; messages of 1 byte to 1 MiB come through intact, in order, answered OK."""
    bodies = [b"x", os.urandom(100), b"a" * 70_000, os.urandom(1 << 20), b"last"]
    for _ in range(4):
        topic = unique("up")
        p = _open(broker, client_tls, combo)
        c = _open(broker, client_tls, combo)
        c.subscribe(topic, "ch", rdy=100)
        p.publish(topic, *bodies)
        got = c.read_messages(len(bodies))
        assert [m.body for m in got] == bodies
        for m in got:
            c.send(C.fin(m.id))
        c.sync()
        p.close()
        c.close()


def test_identify_reply_and_clamped_level(broker, client_tls):
    c = SecureConn(broker.address)
    reply = c.negotiate(client_tls, deflate=True, deflate_level=9)
    assert reply["tls_v1"] and reply["deflate"] and not reply["snappy"]
    assert reply["deflate_level"] == 6 and reply["max_deflate_level"] == 6
    c.sync()
    c.close()


def test_both_compressions_is_fatal(broker):
    with Conn(broker.address) as c:
        c.send(C.identify({"feature_negotiation": True, "snappy": True, "deflate": True}))
        c.expect_fatal("E_IDENTIFY_FAILED", "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")


def test_without_feature_negotiation_nothing_is_upgraded(broker):
    with Conn(broker.address) as c:
        assert c.identify(tls_v1=True, snappy=True) == b"OK"
        c.sync()


def _worker_alive(broker):
    with Conn(broker.address) as c:
        c.sync()


@pytest.mark.parametrize("garbage", [b"\x00" * 64, b"not a TLS record\n" * 10])
def test_garbage_instead_of_a_handshake(broker, garbage):
    c = Conn(broker.address)
    c.send(C.identify({"feature_negotiation": True, "tls_v1": True}))
    assert c.expect_frame()[0] == FRAME_RESPONSE
    c.send(garbage)
    c.read_until_closed()
    _worker_alive(broker)


@pytest.mark.parametrize("kind", ["deflate", "snappy"])
def test_garbage_after_compression(broker, kind):
    c = SecureConn(broker.address)
    c.negotiate(snappy_on=kind == "snappy", deflate=kind == "deflate")
    c.sock.sendall(b"\x02\x05\x00\x00hello" if kind == "snappy" else b"\xff" * 100)
    c.read_until_closed()
    _worker_alive(broker)


def test_snappy_bad_checksum_and_oversized_chunk(broker):
    for bad in (b"\xff\x06\x00\x00sNaPpY\x01\x09\x00\x00\x00\x00\x00\x00hello",     # wrong CRC
                b"\xff\x06\x00\x00sNaPpY\x00\xff\xff\xff"):                          # 16 MiB chunk announced
        c = SecureConn(broker.address)
        c.negotiate(snappy_on=True)
        c.sock.sendall(bad)
        c.read_until_closed()
    _worker_alive(broker)


def test_deflate_bomb_is_bounded(broker):
    """1 GiB of zeros compresses to about 1 MiB: the relay inflates it only as fast as the session parses it, and
    the session drops the connection at the first bad command (zeros are not a command)."""
    c = SecureConn(broker.address)
    c.negotiate(deflate=True)
    enc = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = enc.compress(b"\x00" * (64 << 20)) + enc.flush(zlib.Z_SYNC_FLUSH)
    try:
        for _ in range(16):
            c.sock.sendall(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    c.read_until_closed()
    _worker_alive(broker)


def test_handshake_never_completes(module_nsqd_factory, certs):
    """A client that asks for TLS and then says nothing is dropped (5 s deadline; nothing else waits on it)."""
    broker = module_nsqd_factory(*certs["flags"])
    c = Conn(broker.address)
    c.send(C.identify({"feature_negotiation": True, "tls_v1": True}))
    assert c.expect_frame()[0] == FRAME_RESPONSE
    with Conn(broker.address) as other:  # served meanwhile
        other.sync()
    assert c.next_frame(timeout=60) is None
    broker.wait_for_line("TLS handshake timed out", 60)


@pytest.mark.parametrize("combo", ["deflate", "snappy"])
def test_half_close_still_gets_its_answers(broker, client_tls, combo):
    """A client that sends its last commands and then shuts its sending side gets every answer, then the close
    (as on a plain connection): the relay passes the EOF on instead of dropping the session's replies."""
    c = _open(broker, client_tls, combo)
    topic = unique("half")
    c.send(C.pub(topic, b"a"), C.pub(topic, b"b"))
    c.half_close()
    assert [c.expect_frame(), c.expect_frame()] == [(FRAME_RESPONSE, b"OK")] * 2
    c.expect_closed()
