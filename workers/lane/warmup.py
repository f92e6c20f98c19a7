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
import signal
import struct
import time

from nsqpy.ipc import atomics, diskqueue_kernels, heap, inflight, msglog, ring, statrows, wake
from nsqpy.ipc.msglog import throwaway_log as _throwaway_log  # noqa: F401 (tests drive their logs with it)
from nsqpy.protocol import v2_parser
from nsqpy.workers.connections import handover
from nsqpy.workers.domain import deferred, stats_rows
from nsqpy.workers.lane import fastlane, kernels, pump
from nsqpy.workers.processes import scanner
from nsqpy.workers.publishing import links, records
from nsqpy.workers.timing import timer_batches

# The modules whose kernels the broker's processes call, each declaring its warm-up steps beside its kernels
# (``nsqpy.ipc.numba_cache.warm_up_step``: a module-level WARM_UP list). The order is the compiling processes': the
# costliest first, but a step that calls kernels of an earlier one late enough that, on 2 cores, it finds them in
# the cache instead of compiling them at the same time in the other process: the log's after the delivery round's
# (the append), the records' after the rings' (the ring's write), and the forward lane's after the steps whose
# kernels it calls (it waits for them: its ``waits_for``; on a cold cache it compiles in the background, after all
# of them). A new kernel in one of these modules needs a call in that module's step; a new kernel module, a line here
# (tests/workers/test_warmup_signatures.py fails on a kernel no step compiles).
MODULES = (kernels, pump, inflight, msglog, fastlane, ring, heap, records, deferred, stats_rows, v2_parser,
           diskqueue_kernels, statrows, wake, atomics, links, handover, scanner, timer_batches)


def declared():
    """Every declared step in schedule order: MODULES' steps in their order, the rare paths' ("rare") last."""
    steps = [f for m in MODULES for f in m.WARM_UP]
    return [f for f in steps if f.warm_up_deferred != "rare"] + [f for f in steps if f.warm_up_deferred == "rare"]


def _steps(prefix):
    """The warm-up steps as callables of no argument (a step of shared memory gets this broker's name prefix)."""
    name = prefix.rstrip("-")
    return [functools.partial(f, name) if f.warm_up_shm else f for f in declared()]


def _function(step):
    return getattr(step, "func", step)


def dependencies(steps):
    """{index of a step: indices of the steps in ``steps`` it waits for} (each step's ``waits_for``)."""
    at = {_function(step): i for i, step in enumerate(steps)}
    return {i: tuple(at[f] for f in _function(step).warm_up_waits_for)
            for i, step in enumerate(steps) if _function(step).warm_up_waits_for}


WAIT_LIMIT_S = 300.0   # a step waited for longer than this (a compiling process died?) is compiled here anyway


def step_name(step):
    """A step as progress lines name it: ``ipc.msglog.warm_up`` (its function, without the ``nsqpy.`` prefix)."""
    fn = _function(step)
    return f"{fn.__module__}.{fn.__qualname__}".removeprefix("nsqpy.")


class Progress:
    """The lines a compile prints as its steps finish, one per step, so that a first start's or --compile-only's
    tens of seconds are not silent: ``compiled 3/18: ipc.msglog.warm_up (4.4s), 7.2s so far``. Counted in the
    order the steps finish, whichever process compiled them."""

    def __init__(self, total, log, clock=time.monotonic):
        self.total, self.log, self.clock = total, log, clock
        self.finished = 0
        self.started = clock()

    def step(self, name, seconds):
        self.finished += 1
        if self.log is not None:
            self.log.info(f"compiled {self.finished}/{self.total}: {name} ({seconds:.1f}s), "
                          f"{self.clock() - self.started:.1f}s so far")


_REPORT = struct.Struct("=BI")  # a compiling child's report of a finished step: its index, milliseconds it took


def _compile_in_parallel(steps, queue, processes, done, progress):
    """Cold cache: ``processes`` forked children take the steps at the indices ``queue`` one at a time from a
    shared queue (a pipe of step numbers, in order: whoever is free takes the next), so that numba compiles them
    on every core at once and writes them to its cache; the caller then loads them all (milliseconds each).
    Dealing them out in fixed shares left one child with most of the work on 2 cores. A step of waits_for first
    waits until the steps it names are marked in ``done`` (shared memory), so that it loads their kernels instead
    of compiling them a second time. Each child reports a finished step on a second pipe (one write of a few
    bytes: atomic), and this process prints ``progress`` from those reports until every child has closed it.
    Forking here is safe: the supervisor has no thread yet and numba has compiled nothing."""
    waits = dependencies(steps)
    queue_r, queue_w = os.pipe()
    report_r, report_w = os.pipe()
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
                os.close(report_r)
                while step := os.read(queue_r, 1):  # one byte: a pipe's reads of it are atomic
                    i = step[0]
                    try:
                        _wait_for(done, waits.get(i, ()))
                        t0 = time.monotonic()
                        steps[i]()
                    finally:
                        done[i] = 1
                    os.write(report_w, _REPORT.pack(i, min(round((time.monotonic() - t0) * 1000), 2**32 - 1)))
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(queue_r)
    os.close(report_w)  # the children hold the only write ends now: end of file once all exited
    with os.fdopen(report_r, "rb") as reports:
        while report := reports.read(_REPORT.size):  # (a buffered read: whole reports, until end of file)
            if len(report) == _REPORT.size:
                i, ms = _REPORT.unpack(report)
                progress.step(step_name(steps[i]), ms / 1000)
    failed = sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in pids)
    if failed and progress.log is not None:
        progress.log.warn(f"{failed} of {processes} kernel-compiling processes failed; compiling the rest here")


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
    later, background, progress = [], None, None
    if cache_is_cold():
        if defer and os.access(os.path.dirname(_mark_path()), os.W_OK):
            later = [i for i, step in enumerate(steps) if _function(step) in DEFERRED]
        now = [i for i in range(len(steps)) if i not in later]
        processes = max(1, min(len(now), processes or os.cpu_count() or 1))
        if log is not None:
            log.info(f"compiling the broker's kernels for this version ({len(now)} steps in {processes} processes; "
                     f"the first start after an install or upgrade only)")
        _prune(log)
        if later:
            background = Background.start(steps, later, done, log)
        progress = Progress(len(now), log)
        if processes > 1:
            _compile_in_parallel(steps, now, processes, done, progress)
            progress = None  # the loop below only loads them now
    load_without_registries()
    with quiet_llvm_lock():
        for i, step in enumerate(steps):
            if i not in later:
                t0 = time.monotonic()
                step()
                done[i] = 1
                if progress is not None:  # one compiling process: this one, here
                    progress.step(step_name(step), time.monotonic() - t0)
    if background is None:
        touch_mark()
    return background


@contextlib.contextmanager
def quiet_llvm_lock():
    """Within: llvmlite calls no callback around its lock. numba registers one pair (``numba.core.base``) that
    turns every call into LLVM into two ``numba:llvm_lock`` events, which only numba's compile-time statistics
    listen to; a warm start's loads make some 10,000 such calls, and the events were ~15% of the loading's CPU
    (0.26 -> 0.22 s, 8 runs each). Restored on the way out (a later compile records its statistics again)."""
    try:
        from llvmlite.binding import ffi
        callbacks = ffi.lib._lock._cblist
    except (ImportError, AttributeError):  # another llvmlite: loads as before
        yield
        return
    saved = list(callbacks)
    callbacks.clear()
    try:
        yield
    finally:
        callbacks[:] = saved + [c for c in callbacks if c not in saved]


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
# path (Worker._lane_on_when_ready). The rare paths' kernels (the "rare" steps) are seconds of compiling too; a process that
# takes such a path before the background is done compiles what it needs itself.
LANE = tuple(f for f in declared() if f.warm_up_deferred == "lane")
DEFERRED = tuple(f for f in declared() if f.warm_up_deferred is not None)
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
        with quiet_llvm_lock():
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
