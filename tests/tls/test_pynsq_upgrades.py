"""pynsq's Reader and Writer over every combination of TLS, snappy and deflate, on several topics (so the topics'
owners differ from the workers that accepted the connections), messages up to 512 KiB, and all workers SIGKILLed in
the middle: every publish pynsq saw answered OK is delivered, on every combination."""
from __future__ import annotations

import ssl

import nsq
import pytest

from tests.broker.namespaces import kill_workers, log_on_failure
from tests.broker.test_pynsq import PynsqLoop
from tests.broker.wire import unique

RECONNECT_DEADLINE = 90.0  # pynsq's Reader waits 15 s before reconnecting; a restarted worker recovers first


def _options(combo, certs):
    kw = {}
    if "tls" in combo:
        kw.update(tls_v1=True, tls_options={"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": certs["ca"],
                                            "ssl_version": ssl.PROTOCOL_TLS_CLIENT})
    if "snappy" in combo:
        kw["snappy"] = True
    if "deflate" in combo:
        kw["deflate"] = True
    return kw


COMBOS = ["plain", "tls", "snappy", "deflate", "tls+snappy", "tls+deflate"]


@pytest.fixture
def broker(nsqd_factory, certs):
    return nsqd_factory(*certs["flags"])


def test_every_combination_survives_a_worker_crash(broker, certs):
    lp = PynsqLoop(broker.address)
    try:
        with log_on_failure(broker):
            _run(lp, broker, certs)
    finally:
        lp.close()


def _run(lp, broker, certs):
    pairs = []
    for combo in COMBOS:
        for k in range(2):  # two topics per combination: with two workers, likely one owned by each
            topic = unique(f"{combo.replace('+', '_')}{k}")
            received, acked = set(), set()
            kw = _options(combo, certs)

            def handler(message, received=received):
                received.add(message.body)
                return True

            r = lp.reader(topic, "ch", handler, max_in_flight=50, **kw)
            w = nsq.Writer([lp.address], reconnect_interval=1.0, **kw)
            lp.writers.append(w)
            pairs.append((combo, topic, r, w, received, acked))
    lp.subscribed(*[p[2] for p in pairs])
    lp.run_until(lambda: all(any(c.connected() for c in p[3].conns.values()) for p in pairs),
                 what="writers connected")
    for combo, _, r, _, _, _ in pairs:  # what was negotiated is what was asked for
        [conn] = r.conns.values()
        assert conn.tls_v1 == ("tls" in combo) and conn.snappy == ("snappy" in combo), combo

    def publish_round(tag):
        for combo, topic, _, w, _, acked in pairs:
            bodies = [b"%s-%s-%d" % (tag, combo.encode(), i) for i in range(40)]
            bodies.append(b"%s-big-" % tag + bytes(range(256)) * 2048)  # 512 KiB

            def cb(conn, data, bodies=bodies, acked=acked):
                if data == b"OK":
                    acked.update(bodies)
            w.pub(topic, bodies[0], callback=cb)
            w.mpub(topic, bodies[1:20], callback=cb)
            for b in bodies[20:]:
                w.pub(topic, b, callback=lambda conn, data, b=b, acked=acked: data == b"OK" and acked.add(b))

    publish_round(b"before")
    lp.run_until(lambda: all(len(p[5]) == 41 and p[5] <= p[4] for p in pairs), what="first round delivered")
    before = [c for p in pairs for client in p[2:4] for c in client.conns.values()]  # kept: ids stay unique
    old = {id(c) for c in before}
    kill_workers(broker)

    def reconnected(client):  # a connection made after the kill (pynsq notices the old ones close only now)
        return any(c.connected() and id(c) not in old for c in client.conns.values())
    lp.run_until(lambda: all(reconnected(p[2]) and reconnected(p[3]) for p in pairs),
                 RECONNECT_DEADLINE, "readers and writers reconnected")
    for p in pairs:
        for c in list(p[3].conns.values()):
            assert id(c) not in old or not c.connected()
    publish_round(b"after")
    lp.run_until(lambda: all(len(p[5]) == 82 for p in pairs), what="second round answered OK")
    lp.run_until(lambda: all(p[5] <= p[4] for p in pairs), what="every acknowledged message delivered")


def test_pynsq_with_auth_over_tls_and_snappy(nsqd_factory, certs):
    from tests.tls.authserver import AuthServer
    auth = AuthServer()
    try:
        auth.allow("reader", [{"topic": "^secure", "channels": ["^ch$"], "permissions": ["subscribe"]}],
                   identity="r")
        auth.allow("writer", [{"topic": "^secure", "channels": [".*"], "permissions": ["publish"]}], identity="w")
        broker = nsqd_factory(*certs["flags"], f"--auth-http-address={auth.address}")
        lp = PynsqLoop(broker.address)
        try:
            kw = _options("tls+snappy", certs)
            topic = unique("secure")
            got = []
            r = lp.reader(topic, "ch", lambda m: got.append(m.body) or True, auth_secret="reader", **kw)
            w = nsq.Writer([lp.address], auth_secret="writer", **kw)
            lp.writers.append(w)
            lp.subscribed(r)
            lp.run_until(lambda: any(c.connected() for c in w.conns.values()), what="writer connected")
            bodies = [b"s%d" % i for i in range(20)]
            lp.publish(w, "mpub", topic, bodies)
            lp.published(1)
            lp.run_until(lambda: len(got) == 20, what="delivered")
            assert sorted(got) == sorted(bodies)
            assert {p["tls"] for _, p, _ in auth.requests} == {"true"}
        finally:
            lp.close()
    finally:
        auth.close()
