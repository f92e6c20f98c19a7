"""The IDENTIFY upgrades against nsqpy's nsqd: deflate, snappy and TLS, each with a publish/consume round trip.
Skipped, with the reason, where the broker does not grant the upgrade yet (its server side is issue 13)."""

import ssl

import pytest

from nsqpy.client import Consumer, Producer
from tests.client.helpers import addr, unique, wait_until


def _granted(nsqd, option, **options):
    with Producer([addr(nsqd)], **options) as p:
        p.connect()
        identity = p._async.connection.identity
    assert identity.get(option), f"nsqd did not grant {option} (IDENTIFY reply: {identity})"


def _round_trip(nsqd, **options):
    topic = unique("upgrade")
    got = []
    c = Consumer(topic, "ch", lambda m: got.append(m.body), nsqd_tcp_addresses=[addr(nsqd)], max_in_flight=50,
                 **options).start()
    try:
        with Producer([addr(nsqd)], **options) as p:
            p.publish(topic, b"one")
            p.mpub(topic, [b"%d" % i * 100 for i in range(200)])   # bodies that compress
        wait_until(lambda: len(got) == 201, what="201 messages over the upgraded connections")
        assert c.stats["errors"] == 0
    finally:
        c.stop()


@pytest.mark.parametrize("option", ["deflate", "snappy"])
def test_compressed_round_trip(shared_nsqd, option):
    if option == "snappy":
        pytest.importorskip("nsqpy.protocol.snappy_stream", reason="no snappy codec (cramjam)")
    _granted(shared_nsqd, option, **{option: True})
    _round_trip(shared_nsqd, **{option: True})


def test_tls_round_trip(nsqd_factory, tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    node = nsqd_factory(f"--tls-cert={cert_file}", f"--tls-key={key_file}", workers=1)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    options = {"tls_v1": True, "tls_context": context, "tls_server_hostname": "localhost"}
    _granted(node, "tls_v1", **options)
    _round_trip(node, **options)
    _round_trip(node, deflate=True, **options)   # compression on top of TLS
