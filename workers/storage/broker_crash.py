"""Recovery after a whole-broker crash: the messages a dead nsqd instance left in shared memory are saved to its
data path's on-disk queues before the new instance starts, which then loads them like any clean stop's.

Theory of operation
-------------------
An instance's segments are named from its data path and node id (``nsqpy.ipc.shm``), so the next start on the same data
path finds them; it runs before ``Plan.create`` (which would otherwise clash with the old names). If the old
instance's supervisor is dead (``previous_instance``), every old worker is rebuilt exactly as the supervisor
restarts one after a crash (``Worker(restarted=True)``: its journal, topic logs, in-flight table, deferred store,
and the rings other processes had committed to it) on a ``SalvagePlan`` that attaches the old segments with the
old geometry (worker and producer counts from the links header); then ``Worker.stop`` saves everything unfinished
(``workers/storage/clean_stop.py``) and frees it. Messages in flight at the crash come back requeued, deferred ones keep
their due time, publishes committed in a ring (answered OK) are appended first. One forked child per old worker,
in parallel; the supervisor waits for all of them. Only when every child saved its part are the old segments,
journals and forwarded-publish files removed; otherwise nsqd refuses to start (FATAL, exit 1) and leaves them in
place, so nothing is lost by a second failure: the operator sees why.

A different ``--workers`` on the new start needs nothing special: the queues are loaded by the topics' new owners.
After a reboot there is no shared memory left: durable topics (``--mem-queue-size=0``, control blocks and
segments in files) are salvaged the same way on fresh shared memory (``_after_reboot``); what other topics held
is lost, as NSQ's memory queue.
"""
import dataclasses
import glob
import os
import time
import traceback

from nsqpy.ipc.fdpass import channel_pair
from nsqpy.ipc.heap import TimerHeap
from nsqpy.ipc.inflight import InFlightTable
from nsqpy.ipc.layout import HEADER_WORDS, words
from nsqpy.ipc.shm import Segment, list_segments, live_creators, unlink_name
from nsqpy.ipc.statrows import Board
from nsqpy.workers.control import block as control
from nsqpy.workers.publishing import links
from nsqpy.workers.storage import topic_journal as meta
from nsqpy.ipc.msglog import NO_LOW_WATER
from nsqpy.workers.processes.plan import Plan, _heap_stride


CREATORS_WAIT = 10.0


class SalvageError(RuntimeError):
    pass


class SalvagePlan:
    """What ``Worker`` needs of a ``Plan``, attached to a dead instance's segments."""

    def __init__(self, plan):
        self.opts, self.log = plan.opts, plan.log
        self.data_path, self.node_id, self.prefix = plan.data_path, plan.node_id, plan.prefix
        self._segs = []
        seg = self._attach("links")
        hdr = words(seg.buf, 0, HEADER_WORDS, "links")
        self.workers, self.producers = int(hdr[3]), int(hdr[4])
        self.link_set = links.LinkSet(seg, self.workers, self.producers, reserve=seg.reserver())
        self.control = control.Control(self._attach("control"), self.workers)
        heaps = self._attach("heaps")
        self.inflight, self.meta, self.heaps = [], [], []
        for w in range(self.workers):
            seg = self._attach("inflight", w)
            capacity = InFlightTable(seg.buf, 0).capacity
            stride = _heap_stride(capacity)
            heap = TimerHeap(heaps.buf, w * stride, heaps.reserver())
            self.heaps.append(heap)
            self.inflight.append(InFlightTable(seg.buf, 0, seg.reserver(), heap.reserve_pages))
            self.meta.append(meta.Directory(meta.journal_path(self.data_path, self.prefix, w)))
        self.inboxes = [channel_pair() for _ in range(self.workers)]
        self.stats_board = Board.attach(self._attach("stats").buf)

    def _attach(self, kind, index=0):
        seg = Segment.attach(_name(self.prefix, kind, index))
        seg.adopt()
        self._segs.append(seg)
        return seg


def _name(prefix, kind, index):
    return f"{prefix}{kind}-{index}"


def previous_instance(plan, wait=CREATORS_WAIT):
    """The segments a previous instance of this data path and node id left (empty when there are none). Raises
    SalvageError when that instance is still running (its supervisor, the creator of control-0, is alive). The
    processes of a crashed instance may take a moment to die after its supervisor: wait for them (up to
    ``wait`` seconds), so that nothing is still writing what is about to be saved."""
    names = list_segments(plan.prefix)
    control = f"{plan.prefix}control-0"
    if control in names and live_creators([control]):
        raise SalvageError(f"another nsqd (pid {live_creators([control])[0]}) is running with this data path and "
                           f"node id")
    deadline = time.monotonic() + wait
    while names and live_creators(names) and time.monotonic() < deadline:
        time.sleep(0.02)  # the dead supervisor's children are being killed right now: a few milliseconds
    left = live_creators(names)
    if left:
        raise SalvageError(f"processes {left} of a previous nsqd on this data path are still alive")
    return names


def salvage(plan, log):
    """Save what a dead instance of this data path and node id left; -> messages saved (0: nothing there).
    Raises SalvageError (the old state is left in place) when some of it could not be saved."""
    names = previous_instance(plan)
    journals = glob.glob(os.path.join(glob.escape(plan.data_path), glob.escape(plan.prefix.strip("/")) + "meta-*"))
    if not names:
        if journals:  # a reboot: the shared memory they describe is gone
            return _after_reboot(plan, log, journals)
        return 0
    if _segment_of(names, "links") is None or _segment_of(names, "control") is None:
        log.warn(f"removing {len(names)} shared-memory segments of an instance of this data path that died while "
                 f"starting (it held no messages): {sorted(names)}")
        _remove(plan, names)
        return 0
    t0 = time.monotonic()
    log.info(f"recovering the messages a crashed nsqd left on this data path ({len(names)} segments)")
    try:
        old = SalvagePlan(plan)
    except Exception as e:
        raise SalvageError(f"cannot attach the crashed instance's shared memory: {e}") from None
    pids = [_fork_worker(old, w, log) for w in range(old.workers)]
    failed = [w for w, pid in enumerate(pids) if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
    if failed:
        raise SalvageError(f"workers {failed} of the crashed instance could not save their messages; its shared "
                           f"memory is left as it is ({plan.prefix}*): nsqd does not start over it")
    for seg in old._segs:
        seg.close()
    _remove(plan, list_segments(plan.prefix))
    log.info(f"recovered the crashed instance's messages to disk in {time.monotonic() - t0:.2f}s")
    return len(names)


def _after_reboot(plan, log, journals):
    """The previous instance died and its shared memory is gone. Durable topics (``--mem-queue-size=0``: control
    block and segments in files) are recovered from disk by the same per-worker salvage, on fresh shared memory
    (empty rings, in-flight tables and deferred stores: what was in flight is delivered again from the channels'
    low-water marks); the others' messages are lost with the shared memory, as NSQ's memory queue."""
    durable = glob.glob(os.path.join(glob.escape(plan.data_path), "nsqpy-*.ctrl"))
    log.warn(f"the previous nsqd on this data path did not stop cleanly and its shared memory is gone (a reboot?): "
             f"{len(durable)} durable topics are recovered from disk; messages of other topics since its start are "
             f"lost, as NSQ's memory queue")
    t0 = time.monotonic()
    saved = 0
    if durable:
        workers = 1 + max(int(p.rsplit("meta-", 1)[1].split(".")[0]) for p in journals)
        fresh = Plan(dataclasses.replace(plan.opts, workers=workers), log)
        fresh.create(keep_journals=True)
        try:
            pids = [_fork_worker(fresh, w, log, rebooted=True) for w in range(workers)]
            failed = [w for w, pid in enumerate(pids) if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
        finally:
            for seg in fresh.segments:
                seg.close()
        if failed:
            raise SalvageError(f"workers {failed} could not save the durable topics after a reboot; their files "
                               f"are left as they are: nsqd does not start over them")
        saved = len(durable)
    for path in glob.glob(os.path.join(glob.escape(plan.data_path), "nsqpy-*.seg")) + \
            glob.glob(os.path.join(glob.escape(plan.data_path), "nsqpy-*.ctrl")):
        os.unlink(path)  # what no surviving control block describes any more
    _remove(plan, list_segments(plan.prefix))
    if durable:
        log.info(f"recovered the durable topics from disk in {time.monotonic() - t0:.2f}s")
    return saved


def _segment_of(names, kind):
    return next((n for n in names if f"-{kind}-" in n), None)


def _fork_worker(old, w, log, rebooted=False):
    from nsqpy.workers.processes.worker import Worker  # late: the worker module pulls in every kernel
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        worker = Worker(old, w, True, log)
        if rebooted:
            _rewind_to_low_water(worker)
        worker.stop()
        code = 0 if worker.saved else 1
    except BaseException:
        log.error(f"salvage of worker {w} failed: {traceback.format_exc().strip()}")
    finally:
        os._exit(code)


def _rewind_to_low_water(worker):
    """After a reboot the in-flight table is gone: each channel's cursor goes back to its low-water mark (the
    oldest message it held), so that what was in flight or deferred is delivered again."""
    for t in worker.topics.values():
        for ch in t.channels.values():
            low = t.log.low_water(ch.ch)
            if low != NO_LOW_WATER and low < t.log.cursor(ch.ch):
                t.log.rewind(ch.ch, low)


def _remove(plan, names):
    for name in names:
        unlink_name(name)
    meta.remove_journals(plan.data_path, plan.prefix)
    for path in glob.glob(os.path.join(glob.escape(plan.data_path), glob.escape(plan.prefix.strip("/")) + "fwd-*")):
        os.unlink(path)
