"""AsyncConsumer: one topic/channel from many nsqds, handlers with a concurrency limit, NSQ's flow control.

Theory of operation
-------------------
Connections come from `nsqd_tcp_addresses` (re-dialled every `reconnect_interval` while down) and/or from
polling nsqlookupd (`lookupd_http_addresses`: a poll at start, then every `lookupd_poll_interval` after a random
jitter; a lost connection triggers an early poll). Each connection SUBs and gets its RDY from `RdyPlanner`.

Messages go to a `HandlerRunner` (handlers.py): `concurrency` handler threads for a sync handler (so it may
block), `concurrency` tasks on the loop for an async one. A message past `max_attempts` is not handed to the
handler: the `giving_up` hook sees it and it is FINed. When the handler returns, the message is FINed; when it
raises (or returns False) it is REQed with delay default_requeue_delay x attempts, capped at max_requeue_delay,
unless the handler answered it itself. Every FIN counts as a success and every backing-off REQ as a failure for
the `Backoff` state machine, which zeroes RDY everywhere while it is in a timeout.

`stop()` is graceful: CLS on every connection (nsqd stops sending), wait until every delivered message was
answered or `drain_timeout` passed, then close. Everything here runs on one event loop; `Message.fin()` and
friends may be called from any thread and are forwarded to it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import threading
import time

from nsqpy.client import lookupd
from nsqpy.client.addresses import parse_address
from nsqpy.client.backoff import Backoff
from nsqpy.client.config import Config
from nsqpy.client.conn import Connection
from nsqpy.client.errors import check_name, describe
from nsqpy.client.handlers import HandlerRunner
from nsqpy.client.message import Message
from nsqpy.client.rdy import RdyPlanner
from nsqpy.protocol import client as wire

__all__ = ["AsyncConsumer"]

log = logging.getLogger("nsqpy.client")


class AsyncConsumer:
    def __init__(self, topic: str, channel: str, handler, *, nsqd_tcp_addresses=(), lookupd_http_addresses=(),
                 concurrency: int = 1, giving_up=None, config: Config | None = None, **options):
        check_name("topic", topic)
        check_name("channel", channel)
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [nsqd_tcp_addresses]
        if isinstance(lookupd_http_addresses, str):
            lookupd_http_addresses = [lookupd_http_addresses]
        if not nsqd_tcp_addresses and not lookupd_http_addresses:
            raise ValueError("give nsqd_tcp_addresses and/or lookupd_http_addresses")
        self.topic, self.channel, self.handler = topic, channel, handler
        self.nsqd_addresses = [parse_address(a) for a in nsqd_tcp_addresses]
        self.lookupd_addresses = list(lookupd_http_addresses)
        self.concurrency = max(1, concurrency)
        self.giving_up = giving_up
        self.config = Config.build(config, **options)
        self.rdy = RdyPlanner(self.config)
        self.backoff = Backoff(self.config.backoff_multiplier, self.config.max_backoff_duration)
        self.conns: dict[tuple[str, int], Connection] = {}
        self.stats = {"received": 0, "finished": 0, "requeued": 0, "given_up": 0, "errors": 0}
        self._dialling: set[tuple[str, int]] = set()
        self._dials: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: HandlerRunner | None = None
        self._tasks: list[asyncio.Task] = []
        self._repoll: asyncio.Event | None = None
        self._backoff_timer = None
        self._stopping = False
        self.stopped: asyncio.Event | None = None

    # -- start -------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Dial the given nsqds (waiting for those that answer) and start lookupd polling and the workers."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._repoll = asyncio.Event()
        self.stopped = asyncio.Event()
        self._runner = HandlerRunner(self.handler, self.concurrency, self._loop, self._handled)
        self._tasks = [self._spawn(self._redistribute_loop())]
        if self.lookupd_addresses:
            self._tasks.append(self._spawn(self._lookupd_loop()))
        await asyncio.gather(*(self._dial(addr, retry=True) for addr in self.nsqd_addresses))

    def _spawn(self, coro) -> asyncio.Task:
        return self._loop.create_task(coro)

    async def _dial(self, address, retry: bool) -> None:
        """Connect and SUB; on failure retry every reconnect_interval if `retry` (direct addresses)."""
        if address in self.conns or address in self._dialling or self._stopping:
            return
        self._dialling.add(address)
        try:
            conn = Connection(*address, self.config, on_message=self._on_message, on_error=self._on_error,
                              on_close=self._on_close)
            try:
                await conn.connect()
                await conn.command(wire.sub(self.topic, self.channel))
            except Exception as err:
                conn.close()
                again = f"; again in {self.config.reconnect_interval:g}s" if retry and not self._stopping else ""
                log.warning("consumer %s/%s: %s:%d: %s%s", self.topic, self.channel, *address, describe(err), again)
                if retry and not self._stopping:
                    self._loop.call_later(self.config.reconnect_interval, self._redial, address)
                return
            if self._stopping:
                conn.close()
                return
            self.conns[address] = conn
            conn.last_message_at = time.monotonic()
            log.info("consumer %s/%s: connected to %s", self.topic, self.channel, conn.address)
            if not self.backoff.active:
                self.rdy.update_all(self._live())
            elif not self.backoff.in_timeout and self.rdy.total(self._live()) == 0:
                self.rdy.probe(self._live())
        finally:
            self._dialling.discard(address)

    def _redial(self, address) -> None:
        if not self._stopping:
            self._spawn_dial(address, retry=True)

    def _spawn_dial(self, address, retry: bool) -> None:
        task = self._spawn(self._dial(address, retry))
        self._dials.add(task)              # kept so stop() can cancel a dial still under way
        task.add_done_callback(self._dials.discard)

    def _live(self) -> list[Connection]:
        return [c for c in self.conns.values() if not c.closed]

    async def _lookupd_loop(self) -> None:
        cfg = self.config
        index = 0
        first = True
        while not self._stopping:
            for _ in range(min(3, len(self.lookupd_addresses))):   # up to 3 lookupds per poll, as go-nsq
                address = self.lookupd_addresses[index % len(self.lookupd_addresses)]
                index += 1
                try:
                    found = await self._loop.run_in_executor(
                        None, lookupd.lookup, address, self.topic, cfg.lookupd_request_timeout, cfg.auth_secret)
                except Exception as err:
                    log.warning("lookupd %s: %s", address, err)
                    continue
                for producer in found:
                    self._spawn_dial(producer, retry=False)
                break
            wait = cfg.lookupd_poll_interval
            if first:   # spread the polls of many consumers started together
                wait += random.random() * cfg.lookupd_poll_jitter * cfg.lookupd_poll_interval
                first = False
            self._repoll.clear()
            try:
                await asyncio.wait_for(self._repoll.wait(), wait)
            except TimeoutError:
                pass

    # -- connection events -------------------------------------------------------------------------------------

    def _on_message(self, conn: Connection, raw) -> None:
        conn.in_flight += 1
        conn.last_message_at = time.monotonic()
        self.stats["received"] += 1
        msg = Message(raw, conn, self)
        max_attempts = self.config.max_attempts
        if max_attempts and msg.attempts > max_attempts:
            self.stats["given_up"] += 1
            if self.giving_up is not None:
                try:
                    result = self.giving_up(msg)
                    if inspect.isawaitable(result):
                        self._spawn(result)
                except Exception:
                    log.exception("giving_up hook failed")
            self._respond(msg, "fin", counts_for_backoff=False)
            return
        self._runner.submit(msg)

    def _on_error(self, conn: Connection, err) -> None:
        self.stats["errors"] += 1
        log.warning("consumer %s/%s: %s: %s", self.topic, self.channel, conn.address, err)

    def _on_close(self, conn: Connection, cause) -> None:
        address = (conn.host, conn.port)
        if self.conns.get(address) is not conn:
            return   # it never got past connect/SUB: _dial already decided whether to try again
        del self.conns[address]
        if self._stopping:
            return
        log.warning("consumer %s/%s: lost %s (%s)", self.topic, self.channel, conn.address, cause)
        if not self.backoff.active:
            self.rdy.update_all(self._live())
        if address in self.nsqd_addresses:
            self._loop.call_later(self.config.reconnect_interval, self._redial, address)
        if self.lookupd_addresses:
            self._repoll.set()

    # -- handlers ----------------------------------------------------------------------------------------------

    def _handled(self, msg: Message, result) -> None:
        """The handler returned (result False: it failed or raised): answer the message unless it did."""
        if msg.auto_response and not msg.responded:
            self._respond(msg, "fin" if result is not False else "req")

    def _respond(self, msg: Message, kind: str, delay=None, backoff=True, counts_for_backoff=True) -> None:
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._respond, msg, kind, delay, backoff, counts_for_backoff)
            return
        conn = msg.conn
        if kind == "touch":
            if not msg.responded and not conn.closed:
                conn.send(wire.touch(msg.id))
            return
        if msg.responded:
            return
        msg.responded = True
        conn.in_flight -= 1
        if kind == "fin":
            self.stats["finished"] += 1
            if not conn.closed:
                conn.send(wire.fin(msg.id))
        else:
            self.stats["requeued"] += 1
            if delay is None:
                delay = min(self.config.default_requeue_delay * msg.attempts, self.config.max_requeue_delay)
            if not conn.closed:
                conn.send(wire.req(msg.id, max(0, int(delay * 1000))))
        if counts_for_backoff and (kind == "fin" or backoff):
            self._backoff_result(kind == "fin")
        if self._stopping and self._in_flight() == 0:
            self._drained.set()

    # -- backoff and RDY ---------------------------------------------------------------------------------------

    def _backoff_result(self, success: bool) -> None:
        action = self.backoff.on_result(success)
        if action == "resume":
            log.info("consumer %s/%s: backoff over", self.topic, self.channel)
            self.rdy.update_all(self._live())
        elif action == "timeout":
            duration = self.backoff.duration()
            log.warning("consumer %s/%s: backing off %.1fs (level %d)", self.topic, self.channel, duration,
                        self.backoff.level)
            self.backoff.in_timeout = True
            self.rdy.zero_all(self._live())
            self._backoff_timer = self._loop.call_later(duration, self._backoff_timeout_over)

    def _backoff_timeout_over(self) -> None:
        self.backoff.in_timeout = False
        if self._stopping:
            return
        if self.backoff.level == 0:
            self.rdy.update_all(self._live())
        else:
            self.rdy.probe(self._live())

    async def _redistribute_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.config.rdy_redistribute_interval)   # a period, not synchronisation
            conns = self._live()
            if self.backoff.in_timeout or self._stopping:
                continue
            in_backoff = self.backoff.level > 0
            if self.rdy.needs_redistribution(conns, in_backoff):
                self.rdy.redistribute(conns, in_backoff)
            elif self.rdy.retry_wanted and not in_backoff:
                self.rdy.update_all(conns)

    def set_max_in_flight(self, value: int) -> None:
        """Change max_in_flight on the fly; 0 pauses the consumer (RDY 0 everywhere). Loop thread only."""
        self.rdy.max_in_flight = max(0, value)
        if not self.backoff.active:
            self.rdy.update_all(self._live())

    def is_starved(self) -> bool:
        """True when some connection holds at least 85% of its RDY in flight (go-nsq's IsStarved)."""
        conns = list(self.conns.values())   # one C-level copy: safe to call from a handler thread
        return any(c.rdy and c.in_flight >= 0.85 * c.rdy for c in conns if not c.closed)

    # -- stop --------------------------------------------------------------------------------------------------

    def _in_flight(self) -> int:
        return sum(c.in_flight for c in self.conns.values())

    async def stop(self) -> None:
        """CLS everywhere, let the handlers answer what was delivered (up to drain_timeout), then close."""
        if self._stopping:
            await self.stopped.wait()
            return
        self._stopping = True
        self._drained = asyncio.Event()
        if self._backoff_timer is not None:
            self._backoff_timer.cancel()
        conns = self._live()
        for conn in conns:
            conn.closing = True
        closes = [c.command(wire.cls()) for c in conns]
        if closes:
            await asyncio.wait([self._spawn(c) for c in closes], timeout=self.config.drain_timeout)
        if self._in_flight() > 0:
            try:
                await asyncio.wait_for(self._drained.wait(), self.config.drain_timeout)
            except TimeoutError:
                log.warning("consumer %s/%s: stopping with %d messages unanswered", self.topic, self.channel,
                            self._in_flight())
        for conn in list(self.conns.values()):
            conn.close()
        tasks = self._tasks + list(self._dials)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._runner.close()
        self.stopped.set()
