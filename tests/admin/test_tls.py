"""nsqadmin against an nsqd with ``--tls-required``: plain HTTP gets 403 with the HTTPS port, and nsqadmin asks
again over HTTPS (as Go's client does), verifying the node with ``--http-client-tls-root-ca-file``; without the CA
the node's certificate is refused and the reply says so."""
from __future__ import annotations

import http.client
import ssl

from tests.admin.admin_wire import http_name, q
from tests.broker.conftest import nsqd_factory  # noqa: F401  (fixture)
from tests.broker.wire import unique
from tests.tls.conftest import ca, certs  # noqa: F401  (fixtures)


def https_publish(n, ca_file, topic, body):
    port = int(n.wait_for_line(r"HTTPS: listening on .*:(\d+)$", 60).group(1))
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=60,
                                       context=ssl.create_default_context(cafile=ca_file))
    conn.request("POST", f"/pub?topic={topic}", body=body)
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    conn.close()


def test_tls_required_node_through_https_with_the_root_ca(nsqd_factory, admin_factory, certs):  # noqa: F811
    n = nsqd_factory(*certs["flags"], "--tls-required=true", "--broadcast-address=127.0.0.1", workers=1)
    topic = unique("tls")
    https_publish(n, certs["ca"], topic, b"secret")
    name = http_name(n)
    trusted = admin_factory(f"--nsqd-http-address={name}", f"--http-client-tls-root-ca-file={certs['ca']}")
    doc = trusted.get(f"/api/topics/{q(topic)}")
    assert doc["message"] == "" and doc["message_count"] == 1
    assert [p["http_port"] for p in trusted.get("/api/nodes")["nodes"]] == [n.http_address[1]]
    untrusted = admin_factory(f"--nsqd-http-address={name}")
    status, doc = untrusted.call("GET", "/api/nodes")
    assert status == 502 and "CERTIFICATE_VERIFY_FAILED" in doc["message"], doc
