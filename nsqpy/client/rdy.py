"""How a consumer spreads max_in_flight over its connections (spec 7.2), as go-nsq does.

Each connection's share is max(1, max_in_flight // connections), clamped to the server's max_rdy_count, and
the sum of RDY over all connections never exceeds max_in_flight: a RDY that would break that is cut down to
what is left (and retried later). With more connections than max_in_flight some connections get RDY 0; every
`rdy_redistribute_interval` a connection that has held RDY without a message for `low_rdy_idle_timeout` (or
for longer than `low_rdy_timeout` in total) gives it up, and the free RDY 1s go to randomly chosen connections,
so every nsqd gets its turn. During backoff the same redistribution hands out at most one RDY 1.
"""

from __future__ import annotations

import random
import time

from nsqpy.protocol import client as wire

__all__ = ["RdyPlanner"]


class RdyPlanner:
    def __init__(self, config):
        self.config = config
        self.max_in_flight = config.max_in_flight
        self.retry_wanted = False     # a RDY was cut down by the total; the consumer retries it later

    def per_connection(self, conns) -> int:
        if not conns or self.max_in_flight <= 0:
            return 0
        return min(max(1, self.max_in_flight // len(conns)), self.max_in_flight)

    @staticmethod
    def total(conns) -> int:
        return sum(c.rdy for c in conns)

    def send(self, conn, count: int, conns) -> None:
        """Set one connection's RDY, within max_rdy_count and the max_in_flight total."""
        if conn.closed or conn.closing:
            return
        count = max(0, min(count, conn.max_rdy_count))
        room = self.max_in_flight - self.total(conns) + conn.rdy
        if count > room:
            self.retry_wanted = True
            count = max(room, 0)
        if count == conn.rdy:
            return
        conn.send(wire.rdy(count))
        conn.rdy = count
        conn.last_rdy_at = time.monotonic()

    def update_all(self, conns) -> None:
        """Everyone to their normal share: lower first, so the raised ones find room in the total."""
        target = self.per_connection(conns)
        self.retry_wanted = False
        for conn in conns:
            if conn.rdy > target:
                self.send(conn, target, conns)
        for conn in conns:
            if conn.rdy < target:
                self.send(conn, target, conns)

    def zero_all(self, conns) -> None:
        for conn in conns:
            self.send(conn, 0, conns)

    def probe(self, conns) -> None:
        """After a backoff timeout: RDY 1 to one random connection."""
        live = [c for c in conns if not c.closed and not c.closing]
        if live:
            self.zero_all(conns)
            self.send(random.choice(live), 1, conns)

    def needs_redistribution(self, conns, in_backoff: bool) -> bool:
        return len(conns) > self.max_in_flight or (in_backoff and len(conns) > 1)

    def redistribute(self, conns, in_backoff: bool) -> None:
        now = time.monotonic()
        cfg = self.config
        for conn in conns:
            if conn.rdy > 0 and (now - max(conn.last_message_at, conn.last_rdy_at) > cfg.low_rdy_idle_timeout
                                 or now - conn.last_rdy_at > cfg.low_rdy_timeout):
                self.send(conn, 0, conns)
        available = (1 if in_backoff else self.max_in_flight) - self.total(conns)
        candidates = [c for c in conns if c.rdy == 0 and not c.closed and not c.closing]
        random.shuffle(candidates)
        for conn in candidates[:max(available, 0)]:
            self.send(conn, 1, conns)
