"""Client-certificate policies (require: any certificate, unverified; require-verify: checked against
--tls-root-ca-file), --tls-required on TCP, TLS details in /stats and in the auth server's request."""
from __future__ import annotations

import http.client
import json
import ssl
import time

import pytest
import trustme

from nsqpy.protocol import client as C
from tests.broker.wire import Conn, unique
from tests.tls.authserver import AuthServer
from tests.tls.securewire import SecureConn

HTTPS_RE = r"HTTPS: listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)$"
ALL = [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]


def _client_ctx(ca, cert=None):
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if cert is not None:
        cert.configure_cert(ctx)
    return ctx


def _served(broker, ctx):
    """A TLS connection that gets a PUB answered."""
    c = SecureConn(broker.address)
    c.negotiate(ctx)
    c.publish(unique("pol"), b"x")
    return c


def _refused(broker, ctx):
    """The handshake fails or the broker drops the connection before answering anything over TLS."""
    c = SecureConn(broker.address)
    try:
        c.negotiate(ctx)  # TLS 1.3: the client finishes its side before the broker has checked its certificate
        c.send(C.pub("t", b"x"))
        frame = c.next_frame()
    except (ssl.SSLError, ConnectionError, AssertionError):  # (AssertionError: closed during the upgrade)
        frame = None
    finally:
        c.close()
    assert frame is None, f"served: {frame!r}"


@pytest.fixture(scope="module")
def auth():
    server = AuthServer()
    yield server
    server.close()


def test_require_verify(module_nsqd_factory, certs, ca, auth):
    broker = module_nsqd_factory(*certs["flags"], "--tls-client-auth-policy=require-verify",
                                 f"--tls-root-ca-file={certs['ca']}", f"--auth-http-address={auth.address}")
    good = ca.issue_cert("client.example", common_name="client.example")
    auth.allow("s-cn", ALL)
    c = SecureConn(broker.address)
    c.negotiate(_client_ctx(ca, good))
    c.send(C.auth(b"s-cn"))
    assert json.loads(c.expect_frame()[1])["permission_count"] == 1
    c.publish(unique("cn"), b"x")
    _, params, _ = auth.requests_for("s-cn")[-1]
    assert params["tls"] == "true" and params["common_name"] == "client.example"
    _refused(broker, _client_ctx(ca))                                   # no certificate
    stranger = trustme.CA().issue_cert("other.example")
    _refused(broker, _client_ctx(ca, stranger))                         # not signed by the root CA
    with Conn(broker.address) as plain:                                 # the policy implies --tls-required
        plain.send(C.pub("t", b"x"))
        plain.expect_fatal("E_INVALID", "E_INVALID cannot PUB in current state (TLS required)")
    c.close()


def test_require_accepts_any_certificate(module_nsqd_factory, certs, ca):
    broker = module_nsqd_factory(*certs["flags"], "--tls-client-auth-policy=require")
    stranger = trustme.CA().issue_cert("other.example")
    _served(broker, _client_ctx(ca, stranger)).close()                  # unverified, but there
    _refused(broker, _client_ctx(ca))                                   # none at all


def test_no_policy_asks_for_no_certificate(module_nsqd_factory, certs, ca):
    broker = module_nsqd_factory(*certs["flags"])
    _served(broker, _client_ctx(ca)).close()


@pytest.mark.parametrize("mode", ["true", "tcp-https"])
def test_tls_required(module_nsqd_factory, certs, ca, mode):
    broker = module_nsqd_factory(*certs["flags"], f"--tls-required={mode}")
    with Conn(broker.address) as c:
        c.send(C.pub("t", b"x"))
        c.expect_fatal("E_INVALID", "E_INVALID cannot PUB in current state (TLS required)")
    with Conn(broker.address) as c:  # IDENTIFY is allowed, but not upgrading keeps everything else refused
        c.identify(feature_negotiation=True)
        c.send(C.nop())
        c.expect_fatal("E_INVALID", "E_INVALID cannot NOP in current state (TLS required)")
    c = _served(broker, _client_ctx(ca))
    topic = unique("req")
    c.publish(topic, b"over tls")
    c2 = SecureConn(broker.address)
    c2.negotiate(_client_ctx(ca), deflate=True)
    c2.subscribe(topic, "ch", rdy=1)
    assert c2.read_message().body == b"over tls"
    https_port = int(broker.wait_for_line(HTTPS_RE, 60).group(2))  # (plain HTTP is refused with "true")
    h = http.client.HTTPSConnection("127.0.0.1", https_port, timeout=60, context=_client_ctx(ca))
    deadline = time.monotonic() + 30
    while True:
        h.request("GET", "/stats?format=json&topic=" + topic)
        st = json.loads(h.getresponse().read())
        clients = [cl for t in st["topics"] or [] for ch in t["channels"] for cl in ch["clients"]]
        if clients or time.monotonic() > deadline:
            break
    [cl] = clients
    assert cl["tls"] is True and cl["deflate"] is True and cl["tls_version"].startswith("TLS1.")
    assert cl["tls_cipher_suite"]
    c.close()
    c2.close()



def _get(conn, path, method="GET", body=None):
    conn.request(method, path, body=body)
    r = conn.getresponse()
    return r.status, r.read()


@pytest.mark.parametrize("worker_class", ["sync", "asgi"])
def test_https_and_tls_required_on_http(module_nsqd_factory, certs, ca, worker_class):
    broker = module_nsqd_factory(*certs["flags"], "--tls-required=true",
                                 f"--http-worker-class={worker_class}")
    m = broker.wait_for_line(HTTPS_RE, 60)
    https_port = int(m.group(2))
    s = http.client.HTTPSConnection("127.0.0.1", https_port, timeout=60, context=_client_ctx(ca))
    assert _get(s, "/ping") == (200, b"OK")
    topic = unique("https")
    assert _get(s, f"/pub?topic={topic}", "POST", b"over https") == (200, b"OK")
    host, port = broker.http_address
    h = http.client.HTTPConnection(host, port, timeout=60)
    status, body = _get(h, "/ping")
    assert status == 403 and json.loads(body) == {"message": "TLS_REQUIRED", "https_port": https_port}
    c = _served(broker, _client_ctx(ca))
    c.subscribe(topic, "ch", rdy=1)
    assert c.read_message().body == b"over https"
    c.close()


def test_tcp_https_leaves_http_open(module_nsqd_factory, certs):
    broker = module_nsqd_factory(*certs["flags"], "--tls-required=tcp-https")
    host, port = broker.http_address
    assert _get(http.client.HTTPConnection(host, port, timeout=60), "/ping") == (200, b"OK")
