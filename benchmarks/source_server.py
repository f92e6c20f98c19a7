"""A V2 server that accepts SUB and RDY and sends pre-framed messages as fast as RDY allows, reading FINs.

It is bench_reader's ceiling: what a reader on this machine can consume when the broker costs nothing. The
messages are framed once at start-up (one kernel call, `frames.frame_message_batch`) into a ring of
RING_FRAMES frames with distinct IDs, and sent as slices of it: credit is RDY minus messages in flight, and
each FIN (or REQ) gives one back, as in nsqd. Producers' PUB/MPUB are answered OK and dropped.

`--messages N` sends exactly N messages in all and then nothing (so a reader's --count can be checked), and
`--relay` delivers what producers publish instead of synthetic messages: a broker with no queue beyond a
bounded backlog, for exercising latency.py and compare.py without nsqd. Both need one serving process
(counts and subscribers live in it), so they imply --processes 1. In relay mode a published batch is handed
whole to a subscriber with credit left, so it may overshoot RDY by one batch; DPUB is delivered at once.

    python -m benchmarks.source_server --tcp-address=127.0.0.1:0 [--size 200] [--messages N] [--relay]

Logs NSQ's `TCP: listening on HOST:PORT` line on stderr when ready; on SIGTERM/SIGINT prints one JSON line of
counters (msgs_out, fins, msgs_in, dropped, ...) on stdout.
"""

from __future__ import annotations

import argparse
import collections
import time
from dataclasses import dataclass, field

import numpy as np

from nsqpy.protocol import commands as cmd
from nsqpy.protocol.frames import frame_message_batch, message_frame, message_frame_size
from nsqpy.protocol.ids import IdGenerator, id_to_hex
from nsqpy.protocol.v2_bodies import u8_view

from benchmarks.common import CORES, emit, host_port
from benchmarks.stub_server import Session, StubServer, serve_main

RING_FRAMES = 4096            # > nsqd's max RDY (2500), so one RDY's worth is at most two slices
RELAY_BACKLOG = 1_000_000     # messages a relay holds with no subscriber with credit before dropping the oldest


def frame_ring(size: int, count: int = RING_FRAMES) -> bytes:
    """`count` message frames with `size`-byte bodies and IDs 0..count-1, back to back."""
    body = np.frombuffer(b"s" * size, dtype=np.uint8)
    out = np.empty(message_frame_size(size) * count, dtype=np.uint8)
    frame_message_batch(out, 0, np.full(count, time.time_ns(), dtype=np.int64), np.ones(count, dtype=np.int64),
                        np.arange(count, dtype=np.uint64), body, np.zeros(count, dtype=np.int64),
                        np.full(count, size, dtype=np.int64))
    return out.tobytes()


class Relay:
    """Producers' messages, framed on arrival, handed to subscribers round-robin as their credit allows."""

    def __init__(self, backlog_limit: int = RELAY_BACKLOG):
        self.backlog: collections.deque = collections.deque()   # (frames bytes, message count)
        self.backlog_msgs = 0
        self.backlog_limit = backlog_limit
        self.subscribers: list[Session] = []
        self.ids = IdGenerator(1)

    def publish(self, command, server) -> None:
        now = time.time_ns()
        if isinstance(command, cmd.Mpub):
            n = len(command)
            out = np.empty(int(command.lengths.sum()) + message_frame_size(0) * n, dtype=np.uint8)
            frame_message_batch(out, 0, np.full(n, now, dtype=np.int64), np.ones(n, dtype=np.int64),
                                self.ids.next_ids(n, now), u8_view(command.buffer), command.offsets,
                                command.lengths)
            frames = out.tobytes()
        else:
            n = 1
            frames = message_frame(now, 1, id_to_hex(self.ids.next_id(now)), command.body)
        self.backlog.append((frames, n))
        self.backlog_msgs += n
        while self.backlog_msgs > self.backlog_limit:
            dropped = self.backlog.popleft()[1]
            self.backlog_msgs -= dropped
            server.count("dropped", dropped)
        if self.subscribers:
            self.subscribers.append(self.subscribers.pop(0))
            for session in self.subscribers:
                session.pump()

    def fill(self, session: Session, credit: int) -> None:
        while credit > 0 and self.backlog:
            frames, n = self.backlog.popleft()
            self.backlog_msgs -= n
            session.out.append(frames)
            session.in_flight += n
            credit -= n
            session.server.count("msgs_out", n)


@dataclass
class SourceConfig:
    size: int = 200
    budget: int | None = None      # messages left to send in all (None: no limit)
    relay: Relay | None = None
    ring: memoryview = field(init=False)

    def __post_init__(self):
        self.ring = memoryview(frame_ring(self.size))


class SourceSession(Session):
    def __init__(self, sock, server):
        super().__init__(sock, server)
        self.pos = 0  # next frame of the ring to send

    def on_sub(self, command) -> None:
        super().on_sub(command)
        relay = self.server.config.relay
        if relay is not None:
            relay.subscribers.append(self)

    def published(self, command) -> None:
        relay = self.server.config.relay
        if relay is not None:
            relay.publish(command, self.server)

    def fill(self) -> None:
        credit = self.rdy - self.in_flight
        if not self.subscribed or credit <= 0:
            return
        config = self.server.config
        if config.relay is not None:
            config.relay.fill(self, credit)
            return
        k = min(credit, RING_FRAMES - self.pos)
        if config.budget is not None:
            k = min(k, config.budget)
            config.budget -= k
        if k <= 0:
            return
        frame = message_frame_size(config.size)
        self.out.append(config.ring[self.pos * frame:(self.pos + k) * frame])
        self.pos = (self.pos + k) % RING_FRAMES
        self.in_flight += k
        self.server.count("msgs_out", k)

    def close(self) -> None:
        relay = self.server.config.relay
        if relay is not None and self in relay.subscribers:
            relay.subscribers.remove(self)
        super().close()


def make_server(address=("127.0.0.1", 0), processes: int = CORES, size: int = 200,
                messages: int | None = None, relay: bool = False) -> StubServer:
    if messages is not None or relay:
        processes = 1
    config = SourceConfig(size, messages, Relay() if relay else None)
    return StubServer(SourceSession, address, processes, config)


def start(**kwargs) -> StubServer:
    return make_server(**kwargs).start()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tcp-address", type=host_port, default=("127.0.0.1", 0))
    p.add_argument("--processes", type=int, default=CORES, help="serving processes sharing the listener")
    p.add_argument("--size", type=int, default=200, help="body size of the synthetic messages")
    p.add_argument("--messages", type=int, default=None, help="send exactly this many messages in all")
    p.add_argument("--relay", action="store_true", help="deliver what producers publish instead")
    p.add_argument("--out", default="")
    opts = p.parse_args(argv)
    server = make_server(opts.tcp_address, opts.processes, opts.size, opts.messages, opts.relay)
    emit({"tool": "source_server", **serve_main("source_server", server)}, opts.out)


if __name__ == "__main__":
    main()
