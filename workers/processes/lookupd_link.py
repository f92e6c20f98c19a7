"""nsqd's side of nsqlookupd: the "lookupd" child registers this broker's topics and channels with every lookupd.

Theory of operation
-------------------
One supervised process (started by ``workers/processes/nsqd.py`` when ``--lookupd-tcp-address`` is given) runs an asyncio
loop with one task per lookupd and one poller:

* The poller reads the stats plane (``nsqpy.broker.stats.StatsReader``, the last publications, no round trip to
  the workers) and turns it into the registration state {topic: {channels}}. The difference from the previous
  state becomes V1 commands, appended to every peer's queue in the same step: REGISTER for a new topic or
  channel, UNREGISTER for a deleted channel, UNREGISTER of each channel then of the topic for a deleted topic
  (as nsqd's notifications). It polls when woken and every POLL (0.2 s) besides. Woken: a worker that created
  or deleted a topic or channel publishes that topic's rows in the same loop iteration and then writes this
  process's eventfd (``plan.lookupd_wake``, made in ``prepare`` before fork; ``workers/domain/stats_rows.py``), so the
  command leaves within a few milliseconds of the change, i.e. about when the creating command's reply does
  (nsqd notifies its lookup loop at once too). A burst of changes is one wake-up: the eventfd counts them and
  each poll reads it to zero. The POLL tick covers anything without a wake-up (a replaced worker's topics).
* A peer connects (DIAL_TIMEOUT), sends the magic and IDENTIFY (broadcast_address, tcp_port, http_port,
  version, hostname, as nsqd), then registers the current state as nsqd does (``REGISTER topic`` for a topic with
  no channels, else ``REGISTER topic channel`` per channel), taking the snapshot and clearing its queue in one
  step, so that nothing is registered twice or missed. Then it sends what the poller queues, and PING after
  PING_INTERVAL (15 s) of quiet. Each command waits for its reply (IO_TIMEOUT); any failure or error reply,
  or the connection closing while idle, makes the peer reconnect after RECONNECT (nsqd notices a closed
  connection only at its next command, at the latest with the next PING: sooner costs nothing and registers
  sooner). A lookupd that restarted thus gets the whole state again within about a second.
* The broker stopping (SIGTERM) closes the connections, and lookupd drops every registration of a closed
  connection: nsqd does not UNREGISTER at shutdown either.

Channels of a new topic (spec 1.10): when the poller sees a topic appear (not in its first poll: those existed
before), it asks every connected lookupd's HTTP API (the broadcast address and HTTP port its IDENTIFY reply
named, as nsqd) for ``/channels?topic=`` and creates the non-ephemeral ones this nsqd lacks, through the control
plane (``workers/control/client.py``) on the last producer slot (``plan.producers - 1``: the HTTP API's workers take
the slots from ``plan.workers`` up). nsqd does this synchronously inside topic creation, before any message
moves; here it follows the topic by the poll latency, so a message published in that window goes to the
topic's backlog, which the first channel created then receives (nsqpy's rule for a topic without channels).

Changing the lookupd addresses at runtime (``/config/nsqlookupd_tcp_addresses``): any broker process calls
``set_addresses(plan, addrs)``, which replaces ``<data-path>/<instance>lookupd.json`` atomically (write, fsync,
rename); the poller checks that file's identity (inode, size, mtime) every POLL and connects to new addresses and
drops removed ones, as nsqd's lookup loop. ``get_addresses(plan)`` reads the same file (the flags' list until a
change). The file is written from the flags at start (``prepare``) and removed at shutdown (``remove_state``).
No signal is needed: the poller already wakes every POLL.

Resource handling: one connection per lookupd, its queue bounded by what changes between two reconnects (it is
cleared at each connect). Error handling: the child never exits on a lookupd's failures; a failure is logged
once per streak (then DEBUG), and a recovery once.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from collections import deque

from urllib.parse import quote

from nsqpy.broker.stats import VERSION, StatsReader
from nsqpy.protocol import v1
from nsqpy.protocol.names import is_ephemeral, is_valid_name
from nsqpy.workers.control import commands as CMD

__all__ = ["lookupd_main", "get_addresses", "set_addresses", "prepare", "remove_state", "registrations", "diff",
           "initial_commands"]

POLL = 0.2
PING_INTERVAL = 15.0
DIAL_TIMEOUT = 1.0
IO_TIMEOUT = 5.0       # nsqd's 1 s read deadline is tight for a loaded 2-core host; a stuck lookupd still drops out
RECONNECT = 1.0


# ---- the addresses, shared by every broker process ---------------------------------------------------------

def state_path(plan) -> str:
    return os.path.join(plan.data_path, plan.prefix.strip("/") + "lookupd.json")


def get_addresses(plan) -> list[str]:
    """The lookupd TCP addresses this broker registers with now."""
    try:
        with open(state_path(plan)) as f:
            return list(json.load(f))
    except (OSError, ValueError):
        return list(plan.opts.lookupd_tcp_address)


def set_addresses(plan, addrs: list[str]) -> None:
    """Register with ``addrs`` from now on (within POLL); callable from any process of the broker."""
    path = state_path(plan)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump([str(a) for a in addrs], f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def prepare(plan) -> None:
    """At start, in the supervisor before fork: the flags' addresses become the current ones, and the eventfd by
    which the workers wake the link (``plan.lookupd_wake``) is made."""
    set_addresses(plan, plan.opts.lookupd_tcp_address)
    plan.lookupd_wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def remove_state(plan) -> None:
    try:
        os.unlink(state_path(plan))
    except FileNotFoundError:
        pass


# ---- registrations as data -------------------------------------------------------------------------------

def registrations(stats: dict) -> dict[str, frozenset[str]]:
    """{topic: its channels} from a /stats dict."""
    return {t["topic_name"]: frozenset(c["channel_name"] for c in t["channels"]) for t in stats.get("topics") or ()}


def initial_commands(state: dict) -> list[bytes]:
    """What nsqd sends after IDENTIFY: a topic with no channels alone, else each of its channels."""
    out = []
    for topic in sorted(state):
        channels = state[topic]
        if not channels:
            out.append(v1.register(topic))
        out.extend(v1.register(topic, c) for c in sorted(channels))
    return out


def diff(old: dict, new: dict) -> list[bytes]:
    """The commands that move a lookupd from ``old`` to ``new``."""
    out = []
    for topic in sorted(new.keys() - old.keys()):
        out.append(v1.register(topic))
        out.extend(v1.register(topic, c) for c in sorted(new[topic]))
    for topic in sorted(new.keys() & old.keys()):
        out.extend(v1.register(topic, c) for c in sorted(new[topic] - old[topic]))
        out.extend(v1.unregister(topic, c) for c in sorted(old[topic] - new[topic]))
    for topic in sorted(old.keys() - new.keys()):
        out.extend(v1.unregister(topic, c) for c in sorted(old[topic]))
        out.append(v1.unregister(topic))
    return out


class LookupdError(Exception):
    """A lookupd answered with an error, or with something that is not V1 / HTTP as expected."""


# ---- channels of a new topic (spec 1.10) -------------------------------------------------------------------

async def lookupd_channels(host: str, port: int, topic: str) -> list[str]:
    """GET /channels?topic= from one lookupd (HTTP/1.0: the reply ends with the connection)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), DIAL_TIMEOUT)
    try:
        writer.write(f"GET /channels?topic={quote(topic, safe='')} HTTP/1.0\r\nHost: {host}:{port}\r\n"
                     f"Accept: application/vnd.nsq; version=1.0\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(-1), IO_TIMEOUT)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.") or head[9:12] != b"200":
        raise LookupdError(f"/channels answered {head[:40]!r}")
    return [str(c) for c in json.loads(body).get("channels") or ()]


class ChannelSeeder:
    """Creates the channels lookupd knows for a new topic, through the control plane (in a thread: its calls
    block)."""

    def __init__(self, plan, log):
        self.plan = plan
        self.log = log
        self.control = None
        if plan.producers - 1 < plan.workers:
            log.warn("LOOKUP: no producer slot left (--external-producers=0): channels of new topics are not "
                     "created from lookupd")

    async def seed(self, topic: str, peers, known) -> None:
        if self.plan.producers - 1 < self.plan.workers:
            return
        wanted = set()
        for peer in peers:
            address, port = peer.info.get("broadcast_address"), peer.info.get("http_port")
            if not address or not port:
                continue
            try:
                wanted.update(await lookupd_channels(address, port, topic))
            except (OSError, ValueError, asyncio.TimeoutError, LookupdError) as e:
                self.log.error(f"LOOKUPD({peer.address}): channels of topic {topic}: {e}")
        loop = asyncio.get_running_loop()
        for channel in sorted(wanted):
            if is_ephemeral(channel) or channel in known() or not is_valid_name(channel):
                continue
            self.log.info(f"TOPIC({topic}): creating channel {channel} known to lookupd")
            status = await loop.run_in_executor(None, self._create, topic, channel)
            if status != CMD.OK:
                self.log.error(f"TOPIC({topic}): could not create channel {channel}: "
                               f"{CMD.STATUS_NAMES.get(status, status)}")

    def _create(self, topic, channel):
        if self.control is None:
            from nsqpy.workers.control.client import ControlPlane
            self.control = ControlPlane(self.plan, self.plan.producers - 1)
        return self.control.command("channel_create", topic, channel)


# ---- the process -----------------------------------------------------------------------------------------

class Peer:
    """One lookupd: its connection, its queue of commands, its reconnects."""

    def __init__(self, address: str, registrar: "Registrar"):
        self.address = address
        self.registrar = registrar
        self.log = registrar.log
        self.queue: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.failing = False
        self.info: dict = {}
        self.task = asyncio.get_running_loop().create_task(self.run())

    def push(self, commands) -> None:
        self.queue.extend(commands)
        self.wake.set()

    async def run(self):
        host, _, port = self.address.rpartition(":")
        while True:
            writer = None
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)),
                                                        DIAL_TIMEOUT)
                await self._session(reader, writer)
            except (OSError, ValueError, asyncio.TimeoutError, LookupdError, asyncio.IncompleteReadError) as e:
                level = self.log.debug if self.failing else self.log.error
                level(f"LOOKUPD({self.address}): {type(e).__name__}: {e}; reconnecting in {RECONNECT:.0f}s")
                self.failing = True
            finally:
                if writer is not None:
                    writer.close()
            await asyncio.sleep(RECONNECT)  # a pause before reconnecting, not synchronisation

    async def _session(self, reader, writer):
        decoder = v1.ReplyDecoder()
        writer.write(v1.magic())
        reply = await self._command(reader, writer, decoder, v1.identify(self.registrar.identity()))
        try:
            self.info = json.loads(reply)
        except ValueError:
            raise LookupdError(f"IDENTIFY reply is not JSON: {reply[:100]!r}") from None
        self.log.info(f"LOOKUPD({self.address}): peer info {self.info}")
        if self.failing:
            self.log.info(f"LOOKUPD({self.address}): connected again")
            self.failing = False
        self.queue.clear()   # the snapshot below supersedes every queued change (same step: no await between)
        self.queue.extend(initial_commands(self.registrar.state))
        while True:
            while self.queue:
                command = self.queue[0]
                self.log.info(f"LOOKUPD({self.address}): {command.decode().strip()}")
                await self._command(reader, writer, decoder, command)
                self.queue.popleft()
            self.wake.clear()
            # idle: wait for work, the PING time, or the connection's end (lookupd sends nothing unasked, so
            # anything readable now is EOF: a restarted lookupd is noticed at once, not at the next PING)
            woken = asyncio.ensure_future(self.wake.wait())
            closed = asyncio.ensure_future(reader.read(1))
            done, _ = await asyncio.wait([woken, closed], timeout=PING_INTERVAL,
                                         return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            closed.cancel()
            if closed in done:
                raise LookupdError("connection closed" if not closed.result() else "unexpected data")
            if not done:
                self.log.debug(f"LOOKUPD({self.address}): sending heartbeat")
                await self._command(reader, writer, decoder, v1.ping())

    async def _command(self, reader, writer, decoder, command: bytes) -> bytes:
        writer.write(command)
        await asyncio.wait_for(writer.drain(), IO_TIMEOUT)
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), IO_TIMEOUT)
            if not chunk:
                raise LookupdError("connection closed")
            replies = decoder.feed(chunk)
            if replies:
                break
        reply = replies[0]
        if v1.is_error(reply):
            raise LookupdError(f"{command.split(b' ')[0].strip().decode()} - {reply.decode(errors='replace')}")
        return reply

    def close(self):
        self.task.cancel()


class Registrar:
    def __init__(self, plan, log, tcp_port: int, http_port: int):
        self.plan = plan
        self.log = log
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.hostname = socket.gethostname()
        self.reader = StatsReader.from_plan(plan)
        self.state: dict[str, frozenset[str]] = {}
        self.peers: dict[str, Peer] = {}
        self.seeder = ChannelSeeder(plan, log)
        self.polled = False   # topics of the first poll existed before: only later ones are new
        self._tasks = set()
        self._file_id = ()   # differs from any stat result and from None (no file): the first poll reads it

    def identity(self) -> dict:
        return {"version": VERSION, "tcp_port": self.tcp_port, "http_port": self.http_port,
                "hostname": self.hostname, "broadcast_address": self.plan.opts.broadcast_address}

    def poll(self) -> None:
        """One tick: the address file, then the registrations."""
        try:
            st = os.stat(state_path(self.plan))
            file_id = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            file_id = None
        if file_id != self._file_id:
            self._file_id = file_id
            self._set_peers(get_addresses(self.plan))
        new = registrations(self.reader.stats(include_clients=False, include_mem=False, fresh=False))
        commands = diff(self.state, new)
        created = new.keys() - self.state.keys() if self.polled else ()
        self.state, self.polled = new, True
        if commands:
            for peer in self.peers.values():
                peer.push(commands)
        for topic in created:
            task = asyncio.get_running_loop().create_task(
                self.seeder.seed(topic, list(self.peers.values()), lambda t=topic: self.state.get(t, ())))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _set_peers(self, addresses: list[str]) -> None:
        for address in list(self.peers):
            if address not in addresses:
                self.log.info(f"LOOKUP({address}): removing peer")
                self.peers.pop(address).close()
        for address in addresses:
            if address not in self.peers:
                self.log.info(f"LOOKUP({address}): adding peer")
                self.peers[address] = Peer(address, self)


def lookupd_main(plan, restarted, ready_fd, log):
    """The child's body: runs until SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides
    opts = plan.opts
    tcp_port = opts.broadcast_tcp_port or plan.listener.getsockname()[1]
    http_port = opts.broadcast_http_port or getattr(plan, "http_port", None) or _port_of(opts.http_address)
    asyncio.run(_run(plan, log, tcp_port, http_port, ready_fd))


def _on_wake(fd, woken):
    try:
        os.eventfd_read(fd)  # to zero: one poll answers every change made so far
    except BlockingIOError:
        pass
    woken.set()


def _port_of(address: str) -> int:
    try:
        return int(address.rpartition(":")[2])
    except ValueError:
        return 0  # no HTTP listener: lookupd will refuse the IDENTIFY (missing fields), as it does nsqd's


async def _run(plan, log, tcp_port, http_port, ready_fd):
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    registrar = Registrar(plan, log, tcp_port, http_port)
    woken = asyncio.Event()
    wake_fd = getattr(plan, "lookupd_wake", None)
    if wake_fd is not None:
        loop.add_reader(wake_fd, _on_wake, wake_fd, woken)
    os.write(ready_fd, b"l")
    while not stop.done():
        woken.clear()  # before the poll: a wake-up during it makes the next one start at once
        try:
            registrar.poll()
        except Exception as e:  # a bad stats read must not end registration; the next tick tries again
            log.error(f"LOOKUP: poll failed: {e!r}")
        if not woken.is_set():
            wait = asyncio.ensure_future(woken.wait())
            await asyncio.wait([stop, wait], timeout=POLL, return_when=asyncio.FIRST_COMPLETED)
            wait.cancel()
    log.info("LOOKUP: closing")
    for peer in registrar.peers.values():
        peer.close()
