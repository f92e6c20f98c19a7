"""The client against several real nsqds: RDY spread and redistribution, reconnect after a broker restart,
producer fail-over."""

import threading

from nsqpy.client import Consumer, Producer
from tests.client.helpers import addr, unique, wait_until


def test_rdy_redistribution_across_three_nsqds_with_max_in_flight_below_connections(nsqd_factory):
    nodes = [nsqd_factory(workers=1, node_id=i + 1) for i in range(3)]
    topic = unique("spread")
    got = []
    c = Consumer(topic, "ch", lambda m: got.append((m.nsqd_address, m.body)),
                 nsqd_tcp_addresses=[addr(n) for n in nodes], max_in_flight=2,
                 rdy_redistribute_interval=0.05, low_rdy_idle_timeout=0.2).start()
    totals = []
    watching = threading.Event()

    def watch():   # the invariant: the RDY of all connections together never exceeds max_in_flight
        while not watching.is_set():
            totals.append(c.call(lambda: [x.rdy for x in c.connections]))
    watcher = threading.Thread(target=watch)
    try:
        wait_until(lambda: len(c.connections) == 3, what="3 connections")
        watcher.start()
        for n in nodes:
            with Producer([addr(n)]) as p:
                p.mpub(topic, [b"%d-%d" % (n.port, i) for i in range(30)])
        wait_until(lambda: len(got) == 90, what="90 messages from 3 nsqds")
    finally:
        watching.set()
        if watcher.is_alive():
            watcher.join()
        c.stop()
    per_node = {}
    for address, _ in got:
        per_node[address] = per_node.get(address, 0) + 1
    assert sorted(per_node.values()) == [30, 30, 30]
    assert totals and all(sum(t) <= 2 and max(t) <= 1 for t in totals), [t for t in totals if sum(t) > 2][:5]


def test_rdy_share_when_max_in_flight_covers_every_connection(nsqd_factory):
    nodes = [nsqd_factory(workers=1, node_id=i + 1) for i in range(2)]
    c = Consumer(unique("share"), "ch", lambda m: None, nsqd_tcp_addresses=[addr(n) for n in nodes],
                 max_in_flight=9).start()
    try:
        wait_until(lambda: sorted(c.call(lambda: [x.rdy for x in c.connections])) == [4, 4], what="RDY 4 each")
    finally:
        c.stop()


def test_consumer_and_producer_reconnect_after_a_broker_restart(nsqd_factory):
    first = nsqd_factory(workers=1)
    port = first.port
    topic = unique("restart")
    got = []
    c = Consumer(topic, "ch", lambda m: got.append(m.body), nsqd_tcp_addresses=[addr(first)],
                 reconnect_interval=0.2).start()
    p = Producer([addr(first)], connect_timeout=60.0)
    try:
        p.publish(topic, b"before")
        wait_until(lambda: got == [b"before"], what="the first message")
        assert first.stop() == 0
        wait_until(lambda: not c.connections, what="the consumer noticing the broker is gone")
        second = nsqd_factory(f"--tcp-address=127.0.0.1:{port}", workers=1)
        assert second.port == port
        wait_until(lambda: c.connections, what="the consumer reconnected", timeout=120)
        p.publish(topic, b"after")     # the producer's connection died with the first broker: it re-dials
        wait_until(lambda: got == [b"before", b"after"], what="the message after the restart")
    finally:
        p.close()
        c.stop()


def test_producer_fails_over_to_the_next_nsqd(nsqd_factory):
    a, b = nsqd_factory(workers=1, node_id=1), nsqd_factory(workers=1, node_id=2)
    topic = unique("failover")
    got = []
    consumers = [Consumer(topic, "ch", lambda m: got.append((m.nsqd_address, m.body)),
                          nsqd_tcp_addresses=[addr(n)]).start() for n in (a, b)]
    try:
        with Producer([addr(a), addr(b)]) as p:
            p.publish(topic, b"1")
            wait_until(lambda: len(got) == 1, what="first message")
            consumers[0].stop()
            assert a.stop() == 0
            p.publish(topic, b"2")
            wait_until(lambda: len(got) == 2, what="second message")
        assert got == [(addr(a), b"1"), (addr(b), b"2")]
    finally:
        for c in consumers:
            c.stop()


def test_seed_scenario_example(nsqd_factory):
    import subprocess
    import sys
    node = nsqd_factory(workers=1)
    out = subprocess.run([sys.executable, "-m", "nsqpy.examples.seed_scenario", f"--nsqd-tcp-address={addr(node)}",
                          "--count=500"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "channel B got 500" in out.stdout
