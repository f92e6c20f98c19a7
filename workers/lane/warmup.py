"""Compile (or load from numba's cache) every kernel of the broker's hot paths once, in the supervisor, before it
forks: the children inherit the machine code, so none of them stalls its first client for the milliseconds a
kernel takes to load (numba's refresh before a process's first load took hundreds more: load_without_registries),
or seconds to compile on a cold cache, and a restarted child is ready at once. Each step drives the real classes
on throwaway memory with the argument types production uses.

One exception, on a first start only (a cold cache): the DEFERRED steps (the forward lane, then the kernels of rare
paths) compile in a background process while nsqd starts and listens, and each worker switches the lane on once
it is in the cache (``Background``); until then the loop's Python path does its work.
"""
import contextlib
import functools
import mmap
import os
import select
import signal
import socket
import time

import numpy as np

from nsqpy.ipc.atomics import py_fetch_add
from nsqpy.ipc.heap import TimerHeap, heap_nbytes
from nsqpy.ipc.inflight import InFlightTable, inflight_nbytes
from nsqpy.ipc import msglog_kernels as LK
from nsqpy.ipc.msglog import MessageLog, ShmSegmentProvider, log_ctrl_nbytes
from nsqpy.ipc.ring import C_READ, Ring, record_size
from nsqpy.ipc.shm import Segment, unlink_name
from nsqpy.ipc import statrows
from nsqpy.ipc.wake import Wakeups, wake_check
from nsqpy.workers.publishing.links import Pending
from nsqpy.protocol import client as enc
from nsqpy.protocol.ids import IdGenerator
from nsqpy.protocol.v2_parser import V2Parser
from nsqpy.workers.lane import fastlane
from nsqpy.workers.lane import kernels as K
from nsqpy.workers.publishing import records
from nsqpy.workers.domain import stats_rows as stats
from nsqpy.workers.domain.deferred import DeferredStore, LocalChunks
from nsqpy.workers.connections.handover import OwnerNaps
from nsqpy.workers.lane.pump import Pump, PumpPeer
from nsqpy.workers.processes.scanner import apply_removes, apply_starts

ID = b"0123456789abcdef"


def _protocol():
    stream = (b"  V2" + enc.sub("t", "c") + enc.rdy(5) + enc.rdy(6) + enc.fin(ID) + enc.fin(ID) + enc.fin(ID)
              + enc.req(ID, 0) + enc.touch(ID) + enc.nop())
    sub = V2Parser(stop_after_sub=True)
    sub.feed(stream)
    sub.feed(b"")  # the FINs after the SUB: the batched FIN kernel (fin_run)
    V2Parser(expect_magic=False).feed(enc.mpub("t", [b"a", b"bc"]) + enc.pub("t", b"x") + enc.dpub("t", 5, b"y"))
    IdGenerator(1).next_ids(4, time.time_ns())


def _ring_with_a_record():
    """-> (buffer, ring) of a small ring holding one record."""
    buf = np.zeros(Ring.size_for(1 << 12), np.uint8)
    ring = Ring.create(buf, 0, 1 << 12)
    ring.write(np.frombuffer(b"abc", np.uint8).copy(), 1)  # Ring.write passes any payload read-only
    return buf, ring


def _rings():
    buf, ring = _ring_with_a_record()
    Ring.attach(buf, 0, 1 << 12, Ring.PRODUCER)  # each child recovers the ends of its rings at its start
    Ring.attach(buf, 0, 1 << 12, Ring.CONSUMER)
    ring.can_claim(3)
    record_size(3)  # a forwarding link's test for room (workers/publishing/links.py)
    Pending(buf, [ring.ctl]).which()
    ring.read_batch(16)
    ring.release()
    ring.readable()
    ring.free()
    wake = Wakeups.create(bytearray(Wakeups.size_for(1)), 0, [-1])
    wake.prepare_sleep(0, lambda: True)
    wake_check(wake.flags, 0)  # notify's test (notify itself would write to the eventfd, -1 here)
    py_fetch_add(np.zeros(1, np.int64), 0, 1)  # the control block's counters (workers/control/block.py)
    OwnerNaps(2).saw(1, True)  # the Python path's count of a forward (workers/publishing/forwarding.py)


def _timers():
    heap = TimerHeap.create(bytearray(heap_nbytes(64, 64)), 0, 64, 64)
    apply_starts(heap.ctl, heap.keys, heap.vals, heap.pos, np.zeros(64, np.int64),
                 np.array([[1, 1, 10], [2, 1, 20]], np.int64))
    apply_removes(heap.ctl, heap.keys, heap.vals, heap.pos, np.array([2], np.int64))
    heap.peek_and_shift(100, np.empty(8, np.int64), np.empty(8, np.int64))
    heap.clear()


def _deferred():
    store = DeferredStore(LocalChunks())
    ids = np.arange(3, dtype=np.int64)
    idx = store.add(1, 1, ids, ids * 8, np.zeros(3, np.int64), np.array([5, 1, 9], np.int64))
    store.free(store.due(5))
    store.earliest()
    store.low_water(np.full(4, 1 << 62, np.int64))
    store.free(idx[2:])
    store.recover()


def _inflight():
    table = InFlightTable.create(bytearray(inflight_nbytes(64)), 0, 64)
    ids = np.array([11, 12, 13], np.uint64).view(np.int64)
    slots = np.empty(3, np.int64)
    table.start_batch(1, 1, 5, 0, 10, ids, np.array([0, 8, 16], np.int64), np.ones(3, np.int64), slots)
    table.finish_batch(1, ids[:1], 5, np.empty(1, np.int64), np.empty(1, np.int64))
    s = table.lookup(1, 12, 5)
    table.touch(s, 20)
    table.requeue(s, 0)
    table.redeliver(s, 5, 0, 30)
    table.iter_conn(5)
    K.generations(table, slots[1:])
    K.low_water(table.slots, np.full(4, 1 << 62, np.int64))
    K.slots_of_channel(table.slots, 1, np.empty(4, np.int64))
    K.waiting_positions(table.slots, slots[1:], np.empty(2, np.int64))
    table.release(s)  # a requeued message handed back to its channel
    table.recover()


@contextlib.contextmanager
def _throwaway_log(name):
    """A message log of one segment in shared memory (-> (log, ctrl buffer, provider)), destroyed after."""
    size = 1 << 20
    ctrl = Segment.create(f"{name}-ctrl", log_ctrl_nbytes(size, size))
    memory = ShmSegmentProvider(f"{name}-log")
    log = MessageLog.create(ctrl.buf, 0, segment_size=size, mem_bytes=size, memory=memory)
    try:
        yield log, ctrl.buf, memory
    finally:
        log.destroy()
        ctrl.close()
        ctrl.unlink()
        unlink_name(f"{name}-ctrl")


def _delivery(prefix):
    """A compiled delivery round (nsqpy.workers.lane.kernels.deliver_round), as Channel._deliver_round calls it."""
    with _throwaway_log(f"{prefix}-warmup-round") as (log, _, _):
        ch = log.open_channel()
        log.append(b"hello", time.time_ns(), 1)
        table = InFlightTable.create(bytearray(inflight_nbytes(64)), 0, 64)
        win, words = log.window, np.zeros(16, np.int64)
        K.deliver_round(log.ctrl, win.data, win.data64, ch, 8, 1 << 20, time.time_ns(), time.time_ns() + 10**9,
                        table.ctl, table.slots, table.index, 1, 1, 5, *log.read_arrays(8), np.empty(8, np.int64),
                        np.empty(1024, np.uint8), words, 0, -1)


def _append(log, src):
    log.append_batch(src, np.array([0, 6], np.int64), np.array([5, 5], np.int64), np.zeros(2, np.int64),
                     np.array([1, 2], np.int64), None)


def _log(prefix):
    with _throwaway_log(f"{prefix}-warmup") as (log, ctrl_buf, memory):
        ch = log.open_channel()
        log.waiting()  # a log with a message budget asks at each new segment (open_channels, depth)
        _append(log, np.frombuffer(b"hello world", np.uint8).copy())  # MessageLog passes any source read-only
        b = log.read(ch, 8, 1 << 20)
        log.records_at(b.positions[:1])
        log.cursor(ch)
        log.write_frames(np.empty(1024, np.uint8), 0, b.positions[:b.n], b.attempts[:b.n] + 1)
        log.advance(ch, b.next_position)
        log.copy_forward(ch, b.positions[:1], 1)
        log.copy_forward(ch, b.positions[1:2], 1, parked=True)
        log.depth(ch)
        log.set_low_water(ch, int(b.positions[0]))
        log.reclaim()
        MessageLog.attach(ctrl_buf, 0, memory).recover()
        log.close_channel(ch)  # a deleted channel, or one a restarted worker finds half made


def _rare(prefix):
    """Kernels of rare paths, none of them needed to listen (DEFERRED): a channel's saved queue loaded at a
    worker's start, a crashed worker's channel rewound (salvage), a topic emptied without channels, the head's
    segment sealed when its tier cannot grow, a link releasing part of a batch, a restarted worker's deferred
    store rebuilding its heap."""
    with _throwaway_log(f"{prefix}-warmup-rare") as (log, _, _):
        ch = log.open_channel()
        one = np.ones(1, np.int64)
        at = log.append_private(ch, np.frombuffer(b"queued", np.uint8), one * 0, one * 6, one, one, one, one * 0)
        log.rewind(ch, int(at[0]))
        log.close_channel(ch)
        log.drop_backlog()
        LK.seal_segment(log.ctrl, log.window.data64)  # a direct call: a tier without room is hard to stage
    _, ring = _ring_with_a_record()
    ring.read_batch(16)
    ring.release(int(ring.ctl[C_READ]))  # up to a position: a link that refused a record offers it again
    store = DeferredStore(LocalChunks())
    ids = np.arange(2, dtype=np.int64)
    store.add(1, 1, ids, ids * 8, np.zeros(2, np.int64), np.array([5, 9], np.int64))
    store.recover()  # entries still waiting: the heap is rebuilt from them


def _pump():
    here, there = socket.socketpair()
    pump = Pump(1 << 20)
    try:
        here.setblocking(False)
        peer = PumpPeer(here.fileno())
        pump.add(peer, time.monotonic())
        pump.clean[peer.fd] = 1
        pump.learn_topic("t", 0)
        there.sendall(enc.pub("t", b"x"))
        select.select([here], [], [], 5)
        pump.read()
        out = np.empty(64, np.uint8)
        pump.commit(lambda topic, buf, offsets, lengths: records.pack_forward(out, b"t", buf, offsets, lengths, 0, 0)
                    .size > 0, lambda session, worker: None)
        there.recv(64)
        pump.remove(peer)
    finally:
        pump.close()
        here.close()
        there.close()


def _persistence():
    from nsqpy.ipc import diskqueue_kernels as DK
    frame = np.frombuffer(enc.pub("t", b"x")[:0] + b"\x00\x00\x00\x1f\x00\x00\x00\x02" + bytes(8) + bytes(2)
                          + b"0123456789abcdef" + b"x", np.uint8).copy()
    end = DK.frames_to_records(frame, len(frame))
    cols = [np.zeros(2, np.int64) for _ in range(5)]
    DK.scan_records(np.frombuffer(frame.tobytes(), np.uint8), 0, end, 1 << 20, *cols)  # a file's bytes: read-only


def _steps(prefix):
    """The warm-up steps, in the order the compiling processes take them: the costliest first, but a step that
    calls kernels of an earlier one late enough that, on 2 cores, it finds them in the cache instead of
    compiling them at the same time in the other process: the log's after the delivery round's (the append), the
    records' after the rings' (the ring's write), and the forward lane's after the steps whose kernels it calls
    (it waits for them: ``dependencies``; on a cold cache it compiles in the background, after all of them)."""
    name = prefix.rstrip("-")
    return [functools.partial(_delivery, name), _pump, _inflight, functools.partial(_log, name), fastlane.warm_up,
            _rings, _timers, records.warm_up, _deferred, stats.warm_up, _protocol, _persistence, statrows.warm_up,
            functools.partial(_rare, name)]


# A step whose kernels call kernels of other steps waits for those when the steps compile in parallel, so that it
# loads their kernels from the cache instead of compiling them again: the lane's kernel calls the log's append
# (for a writable source: only the lane's compile has that one), the delivery round's and the pump's kernels, and
# compiled alone it compiles them all
# (benchmarks/results/first_start_steps_own.json against first_start_steps_wait.json; ARCHITECTURE.md, "First start")
WAITS_FOR = {fastlane.warm_up: (_delivery, _pump)}


def _function(step):
    return getattr(step, "func", step)


def dependencies(steps):
    """{index of a step: indices of the steps in ``steps`` it waits for} (``WAITS_FOR``)."""
    at = {_function(step): i for i, step in enumerate(steps)}
    return {i: tuple(at[f] for f in WAITS_FOR[_function(step)])
            for i, step in enumerate(steps) if _function(step) in WAITS_FOR}


WAIT_LIMIT_S = 300.0   # a step waited for longer than this (a compiling process died?) is compiled here anyway


def _compile_in_parallel(steps, queue, processes, done, log):
    """Cold cache: ``processes`` forked children take the steps at the indices ``queue`` one at a time from a
    shared queue (a pipe of step numbers, in order: whoever is free takes the next), so that numba compiles them
    on every core at once and writes them to its cache; the caller then loads them all (milliseconds each).
    Dealing them out in fixed shares left one child with most of the work on 2 cores. A step of WAITS_FOR first
    waits until the steps it names are marked in ``done`` (shared memory), so that it loads their kernels instead
    of compiling them a second time. Forking here is safe: the supervisor has no thread yet and numba has compiled
    nothing."""
    waits = dependencies(steps)
    queue_r, queue_w = os.pipe()
    os.write(queue_w, bytes(queue))  # a few bytes: far below a pipe's capacity, never blocks
    os.close(queue_w)                # so a child reading an empty queue gets end of file
    pids = []
    parent = os.getpid()
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                from nsqpy.process import die_with_parent
                die_with_parent(parent)  # a SIGKILLed nsqd does not leave them compiling
                while step := os.read(queue_r, 1):  # one byte: a pipe's reads of it are atomic
                    i = step[0]
                    try:
                        _wait_for(done, waits.get(i, ()))
                        steps[i]()
                    finally:
                        done[i] = 1
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(queue_r)
    failed = sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in pids)
    if failed and log is not None:
        log.warn(f"{failed} of {processes} kernel-compiling processes failed; compiling the rest here")


def _wait_for(done, indices):
    """Until the steps at ``indices`` are marked done (each is taken before the step that waits, so each is running
    or finished), or WAIT_LIMIT_S passed."""
    give_up = time.monotonic() + WAIT_LIMIT_S
    while any(done[j] == 0 for j in indices) and time.monotonic() < give_up:
        time.sleep(0.05)


WARM_MARK = ".nsqpy-warmed"   # in numba's cache directory once a warm-up there completed


def _mark_path():
    from nsqpy.ipc import numba_cache
    if not numba_cache.CACHE_ENABLED or not numba_cache.CACHE_DIR:
        return None
    return os.path.join(numba_cache.CACHE_DIR, WARM_MARK)


def cache_is_cold():
    """True when no warm-up has completed with numba's cache directory of this version (a first start): a mark
    file there says when one has (each start touches it, for ``nsqpy.ipc.numba_cache.prune``)."""
    path = _mark_path()
    return path is not None and not os.path.exists(path)


def load_without_registries():
    """From now on in this process and its children, a kernel that numba finds in its cache loads without the
    registries numba would fill first (idempotent).

    numba's ``Cache.load_overload`` refreshes the target context before each load. The first refresh in a
    process imports numba's whole library of implementations (linear algebra, random generators, typed
    containers, ...) and installs every template into the typing and lowering registries: in nsqd's supervisor,
    most of the first step's time in a warm start (by hand, py-spy). Only a compile reads those registries, and
    every compile refreshes first itself (``CompilerBase``). Loaded machine code needs only the C symbols it
    links against: numba's helpers and Python's exceptions (added when numba is imported), the hash secrets
    (``numba.cpython.hashing``, imported with numba; named here to be sure) and its runtime, NRT, which a load
    starts here (a load without it crashes the process on the first call). A kernel missing from the cache
    compiles as usual. If numba's cache no longer has the methods this relies on, loads refresh as before."""
    from numba.core.caching import Cache
    from numba.core.runtime import rtsys
    import numba.cpython.hashing  # noqa: F401  (its symbols: see above)
    if getattr(Cache.load_overload, "without_registries", False) or not (
            hasattr(Cache, "_load_overload") and hasattr(Cache, "_guard_against_spurious_io_errors")):
        return

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    load_overload.without_registries = True
    Cache.load_overload = load_overload


def warm_up(prefix, log=None, processes=None, defer=True):
    """prefix: this broker's segment-name prefix (the log step needs real shared memory briefly). On a cold cache
    (the first start after an install or upgrade) the kernels compile in parallel processes, one line saying so,
    and (with ``defer``, when numba's cache is writable) the DEFERRED steps compile in a background process that
    goes on after nsqd listens: -> its ``Background``, or None when every kernel is ready."""
    steps = _steps(prefix)
    done = mmap.mmap(-1, len(steps))  # shared with the children: 1 when step i finished (or failed)
    later, background = [], None
    if cache_is_cold():
        if defer and os.access(os.path.dirname(_mark_path()), os.W_OK):
            later = [i for i, step in enumerate(steps) if _function(step) in DEFERRED]
        now = [i for i in range(len(steps)) if i not in later]
        processes = max(1, min(len(now), processes or os.cpu_count() or 1))
        if log is not None:
            log.info(f"compiling the broker's kernels for this version ({processes} processes; the first start "
                     f"after an install or upgrade only)")
        _prune(log)
        if later:
            background = Background.start(steps, later, done, log)
        if processes > 1:
            _compile_in_parallel(steps, now, processes, done, log)
    load_without_registries()
    for i, step in enumerate(steps):
        if i not in later:
            step()
            done[i] = 1
    if background is None:
        touch_mark()
    return background


def touch_mark(create=True):
    """Mark the warm-up complete (``create``), or only refresh an existing mark's time: the cache is in use."""
    path = _mark_path()
    if path is None or not (create or os.path.exists(path)):
        return
    try:
        with open(path, "a"):
            pass
        os.utime(path)
    except OSError:
        pass  # a read-only cache: the next start compiles in parallel again, nothing worse


MARK_REFRESH_S = 86400.0  # how often a running broker refreshes the mark (mark_keeper)


def mark_keeper(period_s=MARK_REFRESH_S):
    """-> a hook for the supervisor's periodic calls that refreshes an existing mark once a period, so that the
    cache of a broker running for months never looks unused to another install's first start (``_prune``)."""
    due = [time.monotonic() + period_s]

    def keep():
        now = time.monotonic()
        if now >= due[0]:
            due[0] = now + period_s
            touch_mark(create=False)
    return keep


def _prune(log):
    """A first start removes the cache directories of other versions or sources that no start used for a month
    (``nsqpy.ipc.numba_cache.prune``: each is a few MB, and every upgrade leaves one)."""
    from nsqpy.ipc import numba_cache
    removed = numba_cache.prune(WARM_MARK)
    if removed and log is not None:
        log.info(f"removed {len(removed)} numba cache directories no start used for "
                 f"{numba_cache.PRUNE_AFTER_S // 86400:.0f} days, beside {numba_cache.CACHE_DIR}")


# Steps that nsqd does not need in order to listen: on a first start they compile in a background process and nsqd
# listens without waiting for them. The forward lane (workers/lane/fastlane.py: the forwards of lone PUBs and the
# owner's own path) only makes the broker faster, beside a Python path that does the same work; it is the costliest
# step by far, a quarter of a first start's compiling, and until it is in numba's cache the workers use the Python
# path (Worker._lane_on_when_ready). The rare paths' kernels (_rare) are seconds of compiling too; a process that
# takes such a path before the background is done compiles what it needs itself.
LANE = (fastlane.warm_up,)
DEFERRED = LANE + (_rare,)
BACKGROUND_NICE = 10  # the background compile yields to a loaded broker's processes (it still gets ~10% of a core)
FINISH_TIMEOUT = 60.0  # seconds a stopping nsqd waits for it, its last step (Background.finish)


class Background:
    """The DEFERRED steps compiling in a child of the supervisor (forked during the warm-up: it inherits no thread
    and no client), the lane's first. When the lane's are in numba's cache the child sets ``flag``, a byte of
    anonymous shared memory that every later child of the supervisor (the workers, their replacements) sees; a
    worker then loads the lane's kernels (``load``) and switches it on. The rare paths' kernels come next; a
    worker loads those from the cache when it first needs them. When all are done the child writes the warm-up's
    mark. A step that fails leaves the rest undone (the lane's: the flag unset, and the workers keep the Python
    path), and the next start compiles them again."""

    def __init__(self, pid, flag, steps):
        self.pid = pid
        self.flag = flag
        self.steps = steps

    @classmethod
    def start(cls, steps, indices, done, log):
        flag = mmap.mmap(-1, 1)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                from nsqpy.process import die_with_parent
                die_with_parent(parent)  # a SIGKILLed supervisor takes it along
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (the supervisor's traps record it for its loop)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C: the supervisor decides (finish)
                os.nice(BACKGROUND_NICE)
                t0 = time.monotonic()
                waits = dependencies(steps)
                last_lane = max((i for i in indices if _function(steps[i]) in LANE), default=-1)
                for i in indices:
                    _wait_for(done, waits.get(i, ()))
                    steps[i]()
                    if i == last_lane:
                        flag[0] = 1
                        if log is not None:
                            log.info(f"compiled the forward lane's kernels in the background in "
                                     f"{time.monotonic() - t0:.1f}s; the workers switch it on")
                touch_mark()
                if log is not None:
                    log.info(f"compiled the rare paths' kernels in the background; {time.monotonic() - t0:.1f}s in all")
                code = 0
            except BaseException:
                if log is not None:
                    import traceback
                    then = ("the rare paths' kernels failed; a process compiles those it needs" if flag[0] else
                            "the forward lane failed; the workers go on without it")
                    log.error(f"compiling {then}: {traceback.format_exc().strip()}")
            finally:
                os._exit(code)
        if log is not None:
            log.info(f"compiling the forward lane in the background (pid {pid}), then the rare paths' kernels; "
                     f"nsqd serves without them meanwhile")
        return cls(pid, flag, [steps[i] for i in indices if _function(steps[i]) in LANE])

    def ready(self):
        return self.flag[0] == 1

    def load(self):
        """In a worker, once ``ready``: the lane's steps again, which now load its kernels from numba's cache."""
        for step in self.steps:
            step()

    def reap(self):
        """The supervisor's periodic look: collect the child once it exited."""
        if self.pid:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid = self.pid
            if pid:
                self.pid = 0

    def finish(self, log=None, timeout=FINISH_TIMEOUT):
        """At shutdown: a compile still running gets ``timeout`` seconds to complete (so that the next start finds
        the lane in the cache: a broker stopped seconds after its first start, as a test's is, would otherwise
        leave it uncompiled start after start), then is killed (numba writes each cache file whole, by rename)."""
        if not self.pid:
            return
        give_up = time.monotonic() + timeout
        if timeout > 0 and log is not None:
            log.info(f"waiting up to {timeout:.0f}s for the forward lane's compile to complete (first start only)")
        try:
            while not os.waitpid(self.pid, os.WNOHANG)[0]:
                if time.monotonic() >= give_up:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    break
                time.sleep(0.05)
        except ChildProcessError:
            pass  # reaped already (reap)
        self.pid = 0
