"""What the Spark tests share: addresses, polling with a deadline, /stats, and a counting consumer."""

import collections
import json
import urllib.request

from nsqpy.client import Consumer
from tests.polling import wait_until as poll

WITH_HTTP = "--http-address=127.0.0.1:0"   # later on the command line than the fixtures' --http-address=


def addr(nsqd) -> str:
    return f"{nsqd.host}:{nsqd.port}"


def wait_until(condition, deadline_s: float = 120.0, what: str = "condition"):
    return poll(condition, deadline_s, what, 0.05)


def channel_stats(nsqd, topic: str, channel: str) -> dict | None:
    host, port = nsqd.http_address
    url = f"http://{host}:{port}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = json.loads(reply.read())
    body = body.get("data", body)
    for t in body.get("topics") or []:
        if t["topic_name"] == topic:
            for c in t.get("channels") or []:
                if c["channel_name"] == channel:
                    return c
    return None


def drained(nsqds, topic: str, channel: str) -> bool:
    """Every message of the channel answered on every broker: nothing queued, in flight or deferred."""
    for n in nsqds:
        c = channel_stats(n, topic, channel)
        if c is None or c["depth"] or c["in_flight_count"] or c.get("deferred_count", 0):
            return False
    return True


class Collector:
    """Subscribes `channel` before anything is published and counts every body it receives (FIN each)."""

    def __init__(self, topic: str, nsqds, channel: str = "check"):
        self.topic, self.channel, self.nsqds = topic, channel, list(nsqds)
        self.bodies = collections.Counter()
        self.total = 0

        async def handle(message):     # on the consumer's loop thread: no lock needed
            self.bodies[message.body] += 1
            self.total += 1

        self.consumer = Consumer(topic, channel, handle, nsqd_tcp_addresses=[addr(n) for n in self.nsqds],
                                 max_in_flight=2500).start()

    def wait_all(self, expected: int, deadline_s: float = 300.0) -> collections.Counter:
        wait_until(lambda: self.total >= expected and drained(self.nsqds, self.topic, self.channel),
                   deadline_s, f"{expected} messages on {self.topic}/{self.channel} (have {self.total})")
        return self.bodies

    def stop(self):
        self.consumer.stop()
