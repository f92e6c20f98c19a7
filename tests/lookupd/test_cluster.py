"""Real nsqd nodes registering with real nsqlookupd nodes (workers/processes/lookupd_link.py): registrations appear and vanish
as topics and channels come and go and as nsqd stops, the lookupd addresses change at runtime, and the
registering child is restarted by the supervisor. Topics are created with a TCP PUB, channels with SUB;
ephemeral names are deleted by nsqd itself when their last consumer leaves, others through nsqd's HTTP API."""
from __future__ import annotations

import http.client
import os
import re
import signal
import types

from lookupd_wire import eventually
from nsqpy.ipc.shm import instance_prefix
from tests.broker.wire import Conn, consumer, producer, unique
from nsqpy.workers.processes import lookupd_link


def registered(lk, topic):
    """{tcp port: hostname} of /lookup's producers for topic, {} when none or unknown."""
    found = lk.lookup(topic)
    return {p["tcp_port"]: p["hostname"] for p in found["producers"]} if found else {}


def test_registrations_follow_topics_channels_and_nsqd_shutdown(lookupd_factory, registered_nsqd):
    a, b = lookupd_factory(), lookupd_factory()
    n1 = registered_nsqd(a, b, http_port=14151)
    n2 = registered_nsqd(a, b, http_port=24151, node_id=8)
    topic, eph = unique("c"), unique("c") + "#ephemeral"
    producer(n1.address, topic, b"m")
    for lk in (a, b):
        eventually(lambda: set(registered(lk, topic)) == {n1.port}, what="n1 registered the topic")
    [p] = a.lookup(topic)["producers"]
    assert (p["broadcast_address"], p["http_port"], p["version"]) == ("127.0.0.1", 14151, "1.3.0")
    assert p["hostname"] == os.uname().nodename
    with consumer(n2.address, topic, "ch"):
        for lk in (a, b):
            eventually(lambda: set(registered(lk, topic)) == {n1.port, n2.port}, what="n2 registered by SUB")
            eventually(lambda: lk.get_json(f"/channels?topic={topic}") == {"channels": ["ch"]}, what="channel")
    # an ephemeral channel and topic are deleted by nsqd when their last consumer goes: UNREGISTER follows
    c = consumer(n1.address, eph, "e#ephemeral")
    eventually(lambda: set(registered(a, eph)) == {n1.port}, what="ephemeral registered")
    eventually(lambda: a.lookup(eph)["channels"] == ["e#ephemeral"], what="ephemeral channel registered")
    c.close()
    for lk in (a, b):
        eventually(lambda: lk.lookup(eph) is None, what="ephemeral topic gone from lookupd")
    # nodes: both nsqd, with their topics
    nodes = {n["tcp_port"]: n for n in a.get_json("/nodes")["producers"]}
    assert set(nodes) == {n1.port, n2.port} and topic in nodes[n1.port]["topics"]
    # nsqd stopping drops its registrations everywhere (the connection closes)
    assert n2.stop() == 0
    for lk in (a, b):
        eventually(lambda: set(registered(lk, topic)) == {n1.port}, what="n2 gone after its shutdown")
        assert {n["tcp_port"] for n in lk.get_json("/nodes")["producers"]} == {n1.port}


def test_an_nsqd_registers_what_it_had_before_the_lookupd_came(lookupd_factory, registered_nsqd, tmp_path):
    """Addresses changed at runtime (set_addresses): a new lookupd gets the whole state, a removed one loses it."""
    a = lookupd_factory()
    n = registered_nsqd(a)
    topics = [unique("s") for _ in range(3)]
    for t in topics:
        producer(n.address, t, b"x")
    with consumer(n.address, topics[0], "ch"):
        pass
    eventually(lambda: all(registered(a, t) for t in topics), what="registered with a")
    b = lookupd_factory()
    plan = types.SimpleNamespace(data_path=n.data_path, prefix=instance_prefix(n.data_path, n.node_id),
                                 opts=types.SimpleNamespace(lookupd_tcp_address=[a.tcp]))
    assert lookupd_link.get_addresses(plan) == [a.tcp]
    lookupd_link.set_addresses(plan, [b.tcp])
    assert lookupd_link.get_addresses(plan) == [b.tcp]
    eventually(lambda: all(set(registered(b, t)) == {n.port} for t in topics), what="registered with b")
    eventually(lambda: b.get_json(f"/channels?topic={topics[0]}") == {"channels": ["ch"]}, what="channel on b")
    eventually(lambda: not any(registered(a, t) for t in topics), what="a dropped (connection closed)")


def test_the_registering_child_is_restarted_and_registers_again(lookupd_factory, registered_nsqd):
    lk = lookupd_factory()
    n = registered_nsqd(lk)
    topic = unique("r")
    producer(n.address, topic, b"x")
    eventually(lambda: registered(lk, topic), what="registered")
    [before] = [p["remote_address"] for p in lk.lookup(topic)["producers"]]
    pid = int(n.wait_for_line(re.compile(r"lookupd: started \(pid (\d+)\)")).group(1))
    os.kill(pid, signal.SIGKILL)
    n.wait_for_line(re.compile(r"lookupd \(pid %d\) died" % pid))
    eventually(lambda: [p["remote_address"] for p in lk.lookup(topic)["producers"]] not in ([], [before]),
               what="registered again by the new child, on a new connection")
    assert set(registered(lk, topic)) == {n.port}
    producer(n.address, topic + "-2", b"y")
    eventually(lambda: registered(lk, topic + "-2"), what="the new child follows new topics")


def test_unreachable_lookupd_does_not_stop_nsqd(registered_nsqd, lookupd_factory):
    lk = lookupd_factory()
    n = registered_nsqd(lk, flags=("--lookupd-tcp-address=127.0.0.1:1",))
    topic = unique("u")
    with Conn(n.address) as c:
        c.publish(topic, b"x")
    eventually(lambda: registered(lk, topic), what="the reachable lookupd got it")
    n.wait_for_line(re.compile(r"LOOKUPD\(127\.0\.0\.1:1\): .*reconnecting"))


def test_identify_announces_the_http_api_port(lookupd_factory, registered_nsqd):
    lk = lookupd_factory()
    n = registered_nsqd(lk, http_port=None)
    http_port = int(n.wait_for_line(re.compile(r"HTTP: listening on .*:(\d+)$")).group(1))
    topic = unique("p")
    producer(n.address, topic, b"x")
    eventually(lambda: registered(lk, topic), what="registered")
    [p] = lk.lookup(topic)["producers"]
    assert (p["tcp_port"], p["http_port"]) == (n.port, http_port)


def test_a_new_topic_gets_the_channels_lookupd_knows(lookupd_factory, registered_nsqd):
    """Spec 1.10: nsqd asks lookupd's /channels for a new topic and creates its non-ephemeral channels."""
    lk = lookupd_factory("--broadcast-address=127.0.0.1")  # what nsqd dials for /channels
    topic = unique("k")
    for channel in ("keep", "also", "gone%23ephemeral"):
        assert lk.request("POST", f"/channel/create?topic={topic}&channel={channel}")[0] == 200
    n = registered_nsqd(lk)
    producer(n.address, topic, b"first")

    def channels_from_n():
        debug = lk.get_json("/debug")
        return sorted(key.split(":")[2] for key, entries in debug.items()
                      if key.startswith(f"channel:{topic}:") and any(e["tcp_port"] == n.port for e in entries))
    eventually(lambda: channels_from_n() == ["also", "keep"], what="nsqd created and registered lookupd's channels")
    with consumer(n.address, topic, "also", rdy=1) as c:  # the message came before the channels: a backlog
        assert c.read_message().body == b"first"


def test_a_restarted_registry_gets_everything_registered_again(lookupd_factory, registered_nsqd):
    """The registry process holds the registrations (as nsqlookupd's memory): killed, it is restarted by the
    supervisor on the same sockets, nsqd reconnects and registers again, and the HTTP workers reconnect."""
    lk = lookupd_factory()
    n = registered_nsqd(lk)
    topic = unique("g")
    with consumer(n.address, topic, "ch"):
        pass
    eventually(lambda: lk.lookup(topic) and lk.lookup(topic)["channels"] == ["ch"] and registered(lk, topic),
               what="registered")
    pid = int(lk.wait_for_line(r"registry: started \(pid (\d+)\)").group(1))
    os.kill(pid, signal.SIGKILL)
    lk.wait_for_line(r"registry \(pid %d\) died" % pid)
    eventually(lambda: lk.request("GET", "/topics")[0] == 200, what="HTTP answering from the new registry")
    eventually(lambda: set(registered(lk, topic)) == {n.port} and lk.lookup(topic)["channels"] == ["ch"],
               what="nsqd registered again with the new registry")


def test_deleting_a_channel_and_a_topic_on_nsqd_unregisters_them(lookupd_factory, registered_nsqd):
    """Deletion through nsqd's HTTP API (the control plane): UNREGISTER of the channel, then of the topic."""
    lk = lookupd_factory()
    n = registered_nsqd(lk, http_port=None)
    http_port = int(n.wait_for_line(re.compile(r"HTTP: listening on .*:(\d+)$")).group(1))
    topic = unique("d")
    for channel in ("a", "b"):
        with consumer(n.address, topic, channel):
            pass

    def nsqd_entries(key):
        return [e for e in lk.get_json("/debug").get(key, []) if e["tcp_port"] == n.port]
    eventually(lambda: nsqd_entries(f"channel:{topic}:a") and nsqd_entries(f"channel:{topic}:b"), what="registered")

    def post(path):
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
        try:
            conn.request("POST", path)
            return conn.getresponse().status
        finally:
            conn.close()
    assert post(f"/channel/delete?topic={topic}&channel=a") == 200
    eventually(lambda: not nsqd_entries(f"channel:{topic}:a"), what="channel a unregistered")
    assert nsqd_entries(f"channel:{topic}:b") and registered(lk, topic)
    assert post(f"/topic/delete?topic={topic}") == 200
    eventually(lambda: not registered(lk, topic) and not nsqd_entries(f"channel:{topic}:b"),
               what="topic and its channels unregistered")
