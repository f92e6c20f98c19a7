"""Bad input from the server side: garbage, frames cut off mid-way, silence. The client raises or reconnects
and never hangs. Also the IDENTIFY upgrades (TLS, deflate) against a scripted server, since nsqpy's nsqd does
not grant them yet."""

import json
import shutil
import ssl
import subprocess
import time
import zlib

import pytest

from nsqpy.client import ClientError, ConnectionClosed, Consumer, NoConnection, Producer
from nsqpy.protocol.client import FrameDecodeError
from tests.client.fake_nsqd import FakeNsqd, frame, handshake, message, recv_exact, recv_line, recv_sized
from tests.client.helpers import wait_until


@pytest.fixture
def fake():
    servers = []

    def start(script):
        s = FakeNsqd(script)
        servers.append(s)
        return s
    yield start
    for s in servers:
        s.close()
        assert not s.errors, s.errors


def _reply_to_pub_with(data):
    def script(index, sock):
        handshake(sock)
        recv_line(sock)
        recv_sized(sock)
        sock.sendall(data)
        time.sleep(0.2)   # keep the socket open a moment: the client must act on the bytes, not on EOF
    return script


@pytest.mark.parametrize("data, error", [
    (frame(0, b"OK")[:6], ConnectionClosed),                       # closed in the middle of a frame header
    (frame(0, b"OK" * 50)[:40], ConnectionClosed),                 # closed in the middle of a frame body
    (b"\xff\xff\xff\xf0garbage!", ConnectionClosed),                # negative frame size
    (frame(7, b"what"), ConnectionClosed),                         # unknown frame type
    (frame(1, b"E_PUB_FAILED the disk is full"), ClientError),     # an error frame: raised with its code
])
def test_producer_raises_on_garbage_or_a_cut_frame(fake, data, error):
    server = fake(_reply_to_pub_with(data))
    with Producer([server.address], connect_timeout=0.5, timeout=30) as p:
        started = time.monotonic()
        with pytest.raises(Exception) as info:
            p.publish("t", b"x")
        assert time.monotonic() - started < 20
    if error is ClientError:
        assert getattr(info.value, "code", None) == "E_PUB_FAILED"
    else:
        assert isinstance(info.value, (ConnectionClosed, FrameDecodeError)), repr(info.value)


def test_silent_server_times_out_instead_of_hanging(fake):
    def silent(index, sock):
        recv_exact(sock, 4)
        time.sleep(3)
    server = fake(silent)
    with Producer([server.address], read_timeout=0.3, connect_timeout=0.5) as p:
        with pytest.raises(NoConnection):
            p.publish("t", b"x")


def test_consumer_reconnects_after_a_frame_cut_in_half(fake):
    good = message(1, b"0123456789abcdef", b"hello")

    def script(index, sock):
        handshake(sock)
        assert recv_line(sock) == b"SUB t c\n"
        sock.sendall(frame(0, b"OK"))
        recv_line(sock)                       # RDY
        if index == 0:
            sock.sendall(good[:20])           # half a message, then the connection ends
            return
        sock.sendall(good)
        assert recv_line(sock) == b"FIN 0123456789abcdef\n"
    server = fake(script)
    got = []
    c = Consumer("t", "c", lambda m: got.append(m.body), nsqd_tcp_addresses=[server.address],
                 reconnect_interval=0.1).start()
    try:
        wait_until(lambda: got == [b"hello"], what="the message on the second connection")
        assert server.connections >= 2
    finally:
        c.stop()


def test_heartbeats_are_answered_with_nop(fake):
    seen = []

    def script(index, sock):
        handshake(sock)
        sock.sendall(frame(0, b"_heartbeat_"))
        seen.append(recv_line(sock))
    server = fake(script)
    with Producer([server.address]) as p:
        p.connect()
        wait_until(lambda: seen, what="the NOP")
    assert seen == [b"NOP\n"]


def test_deflate_upgrade(fake):
    def script(index, sock):
        body = handshake(sock, {"deflate": True, "deflate_level": 3, "max_rdy_count": 2500, "version": "1.3.0"})
        assert body["deflate"] is True and body["feature_negotiation"] is True
        out = zlib.compressobj(3, zlib.DEFLATED, -15)
        inflate = zlib.decompressobj(-15)
        sock.sendall(out.compress(frame(0, b"OK")) + out.flush(zlib.Z_SYNC_FLUSH))
        data = b""
        while b"hello deflate" not in data:
            data += inflate.decompress(recv_exact(sock, 1))
        assert data.startswith(b"PUB t\n")
        sock.sendall(out.compress(frame(0, b"OK")) + out.flush(zlib.Z_SYNC_FLUSH))
        time.sleep(0.2)
    server = fake(script)
    with Producer([server.address], deflate=True, deflate_level=3) as p:
        p.publish("t", b"hello deflate")


@pytest.fixture
def certificate(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    return str(cert), str(key)


def test_tls_upgrade(fake, certificate):
    cert, key = certificate
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)

    def script(index, sock):
        handshake(sock, {"tls_v1": True, "max_rdy_count": 2500, "version": "1.3.0"})
        with server_ctx.wrap_socket(sock, server_side=True) as tls:
            tls.sendall(frame(0, b"OK"))
            assert recv_line(tls) == b"PUB t\n"
            assert recv_sized(tls) == b"over tls"
            tls.sendall(frame(0, b"OK"))
            time.sleep(0.2)
    server = fake(script)
    client_ctx = ssl.create_default_context(cafile=cert)
    with Producer([server.address], tls_v1=True, tls_context=client_ctx, tls_server_hostname="localhost") as p:
        p.publish("t", b"over tls")


def test_snappy_upgrade(fake):
    snappy_stream = pytest.importorskip("nsqpy.protocol.snappy_stream", reason="no snappy codec (cramjam)")

    def script(index, sock):
        body = handshake(sock, {"snappy": True, "max_rdy_count": 2500, "version": "1.3.0"})
        assert body["snappy"] is True
        out, inflate = snappy_stream.SnappyEncoder(), snappy_stream.SnappyDecoder()
        sock.sendall(out.encode(frame(0, b"OK")))
        data = b""
        while b"hello snappy" not in data:
            inflate.feed(sock.recv(65536))
            data += inflate.read(1 << 20)
        assert data.startswith(b"PUB t\n")
        sock.sendall(out.encode(frame(0, b"OK")))
        time.sleep(0.2)
    server = fake(script)
    with Producer([server.address], snappy=True) as p:
        p.publish("t", b"hello snappy")


def test_identify_reply_json_is_kept(fake):
    def script(index, sock):
        handshake(sock, {"max_rdy_count": 7, "version": "1.3.0", "msg_timeout": 60000})
        time.sleep(0.3)
    server = fake(script)
    with Producer([server.address]) as p:
        p.connect()
        conn = p._async.connection
        assert conn.max_rdy_count == 7 and conn.identity["version"] == "1.3.0"
    json.dumps(conn.identity)
