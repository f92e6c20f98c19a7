"""Running a consumer's handler on its messages, `concurrency` at a time.

An async handler runs as `concurrency` tasks on the consumer's loop. A sync handler runs in `concurrency`
threads of its own, so it may block (HTTP calls, disk) without stalling heartbeats or other connections.

Why not `loop.run_in_executor` per message: every hand-over between the loop thread and a handler thread can
wait for the GIL's switch interval (5 ms), which capped a no-op handler at ~6k msgs/s. Here the threads take
messages from a plain thread-safe queue, a thread that finds a backlog takes its share of it at once (at most
BATCH), and the results go back in a deque with one loop wake-up per batch, not per message. A thread takes
only its share (backlog / concurrency) so slow handlers still run `concurrency` wide.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import queue
import threading

__all__ = ["HandlerRunner"]

log = logging.getLogger("nsqpy.client")
BATCH = 64
_STOP = object()


class HandlerRunner:
    def __init__(self, handler, concurrency: int, loop: asyncio.AbstractEventLoop, done):
        self.handler = handler
        self.concurrency = max(1, concurrency)
        self.loop = loop
        self.done = done                   # done(message, result) on the loop; result False means failure
        self.is_async = inspect.iscoroutinefunction(handler)
        if self.is_async:
            self._queue: asyncio.Queue = asyncio.Queue()
            self._tasks = [loop.create_task(self._task()) for _ in range(self.concurrency)]
        else:
            self._work: queue.SimpleQueue = queue.SimpleQueue()
            self._results: collections.deque = collections.deque()
            self._wake_lock = threading.Lock()
            self._wake_pending = False
            self._threads = [threading.Thread(target=self._thread, name=f"nsq-handler-{i}", daemon=True)
                             for i in range(self.concurrency)]
            for t in self._threads:
                t.start()

    def submit(self, message) -> None:
        if self.is_async:
            self._queue.put_nowait(message)
        else:
            self._work.put(message)

    async def close(self) -> None:
        """Let the handlers finish what they were given, then end the tasks or threads."""
        for _ in range(self.concurrency):
            self.submit(_STOP)
        if self.is_async:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        else:
            for t in self._threads:
                await asyncio.to_thread(t.join)
            self._answer()

    async def _task(self) -> None:
        while True:
            msg = await self._queue.get()
            if msg is _STOP:
                return
            try:
                result = await self.handler(msg)
            except Exception:
                log.exception("handler failed on %r", msg)
                result = False
            self.done(msg, result)

    def _thread(self) -> None:
        work = self._work
        while True:
            batch = [work.get()]
            share = min(BATCH, work.qsize() // self.concurrency)
            for _ in range(share):
                try:
                    batch.append(work.get_nowait())
                except queue.Empty:
                    break
            stop = False
            for msg in batch:
                if msg is _STOP:
                    stop = True
                    continue
                self._results.append((msg, self._call(msg)))
            with self._wake_lock:
                wake = not self._wake_pending
                self._wake_pending = True
            if wake:
                try:
                    self.loop.call_soon_threadsafe(self._answer)
                except RuntimeError:   # the loop is closed: nobody is left to answer
                    return
            if stop:
                return

    def _call(self, msg):
        try:
            result = self.handler(msg)
            if inspect.isawaitable(result):   # a sync function that returned a coroutine
                result = asyncio.run_coroutine_threadsafe(result, self.loop).result()
            return result
        except Exception:
            log.exception("handler failed on %r", msg)
            return False

    def _answer(self) -> None:
        with self._wake_lock:
            self._wake_pending = False
        results = self._results
        while results:
            msg, result = results.popleft()
            self.done(msg, result)
