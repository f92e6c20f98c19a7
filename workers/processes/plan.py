"""Everything the broker's processes share, created by the supervisor before it forks anything.

Theory of operation: the supervisor builds one ``Plan``: the listening socket, one fd hand-over channel per worker
(``nsqpy.ipc.fdpass``), one eventfd per reading process, and the shared-memory segments:

    control     per-process words: connections served, restarts, the scanner epoch   (workers/control/block.py)
    links       the SPSC rings: producer slot i -> worker j (publishes and commands, i != j; slots past the
                workers are --external-producers'), worker i -> scanner, scanner -> worker i, and the reply
                lines of the producer slots                                          (workers/publishing/links.py)
    inflight-i  worker i's in-flight table, --max-in-flight-per-worker slots         (ipc/inflight.py)
    heaps       one timer heap per worker, the scanner's                             (ipc/heap.py)
    stats       the stats plane's board: per worker its table's generation and the readers' requests
                (nsqpy/broker/stats.py); each worker creates its own row tables (stats<w>-<generation>)
and one journal file per worker under the data path: worker i's topic and channel directory, to find its logs after
a restart (``workers/storage/topic_journal.py``).

Shared memory that grows with use: the links, in-flight and heaps segments are sparse; each layout reserves its
fixed part at creation and the rest as it is first used (ring pages as a ring first holds that much; in-flight
slots from INFLIGHT_INITIAL up, doubling, with the matching heap pages). So an idle broker holds only
``idle_shm_bytes`` of /dev/shm: O(workers), about 0.2 MiB a worker (ARCHITECTURE.md, "Shared memory per
broker"), where reserving everything up front took 2 x 32 MiB per pair of workers plus 37 MiB per worker.
The pub rings' capacity comes from --ring-budget (``links.pub_capacity``).

Children inherit the Plan through fork, mappings included: a restarted child is forked from the supervisor again
and so finds every segment exactly where its predecessor left it. Segments are created by the supervisor, which
unlinks them at shutdown (``destroy``). Topic logs are created by their owner worker, which
destroys them at clean shutdown.
"""
import glob
import mmap
import os

from nsqpy.ipc.fdpass import channel_pair
from nsqpy.ipc.heap import TimerHeap, heap_nbytes, heap_reserved_ranges
from nsqpy.ipc.inflight import InFlightTable, inflight_nbytes, inflight_reserved_ranges
from nsqpy.ipc.layout import align_up
from nsqpy.ipc.shm import PAYLOAD_OFFSET, Segment, instance_prefix, list_segments, segment_name, unlink_name
from nsqpy.ipc.statrows import Board
from nsqpy.broker import stats as stats_plane
from nsqpy.workers.control import block as control
from nsqpy.workers.storage import leftovers
from nsqpy.workers.publishing import links
from nsqpy.workers.storage import topic_journal as meta

INFLIGHT_CAPACITY = 1 << 17   # the default of --max-in-flight-per-worker
INFLIGHT_INITIAL = 1024       # in-flight slots (and heap entries) reserved per worker at start


class Plan:
    def __init__(self, opts, log):
        self.opts = opts
        self.log = log
        self.workers = max(1, opts.workers)
        self.producers = self.workers + getattr(opts, "external_producers", 0)
        self.inflight_capacity = getattr(opts, "max_in_flight_per_worker", INFLIGHT_CAPACITY)
        self.pub_capacity = links.pub_capacity(getattr(opts, "ring_budget", links.RING_BUDGET), self.workers,
                                               self.producers)
        self.data_path = opts.data_directory()
        self.node_id = opts.node_id
        self.prefix = instance_prefix(self.data_path, self.node_id)
        self.segments = []
        self.listener = None       # the TCP listener: nsqd binds it before anything else (nsqd._bind_listeners)
        self.inboxes = []          # (receiving end, sending end) per worker
        self.link_set = None
        self.control = None
        self.background = None     # a first start's compile of the forward lane (workers/lane/warmup.py Background)
        self.stats_board = None    # the stats plane's board (nsqpy/broker/stats.py); workers add their tables

    # ---- creation (supervisor, before fork) ------------------------------------------------------------
    def name(self, kind, index=0):
        return segment_name(self.data_path, self.node_id, kind, index)

    def _create(self, kind, size, index=0, reserve=None):
        """A new segment; ``reserve=0`` leaves its payload sparse for a layout that reserves what it touches."""
        seg = Segment.create(self.name(kind, index), size, reserve=reserve)
        self.segments.append(seg)
        return seg

    def remove_stale(self):
        """Segments of dead broker instances of other data paths or node ids (ours was salvaged before this,
        ``workers/storage/broker_crash.py``): an instance is dead once its supervisor is (``nsqpy.ipc.shm.find_dead_instances``).
        One that may hold messages is kept for its own next start, which recovers them; the others hold nothing
        and are removed. One line says so (``nsqd --leftovers`` lists them, ``workers/storage/leftovers.py``)."""
        found = [x for x in leftovers.find() if x.prefix != self.prefix]
        gone = [x for x in found if not x.messages]
        for x in gone:
            leftovers.remove(x)
        line = leftovers.summary([x for x in found if x.messages], gone)
        if line:
            self.log.warn(line)

    def create(self, keep_journals=False):
        """``keep_journals``: open the workers' journals as they are (salvage after a reboot) instead of new."""
        self.remove_stale()
        leftovers.record(self.prefix, self.data_path, self.node_id)  # for `nsqd --leftovers`, should this die
        self.control = control.Control.create(self._create("control", control.nbytes(self.workers)), self.workers)
        self._log_rings()
        seg = self._create("links", links.nbytes(self.workers, self.producers, self.pub_capacity), reserve=0)
        self.link_set = links.LinkSet.create(seg, self.workers, self.producers, self.pub_capacity, seg.reserver())
        cap = self.inflight_capacity
        initial = min(INFLIGHT_INITIAL, cap)
        size = _heap_stride(cap)
        heaps = self._create("heaps", self.workers * size, reserve=0)
        self.heaps = [TimerHeap.create(heaps.buf, w * size, cap, cap, heaps.reserver(), initial)
                      for w in range(self.workers)]
        self.inflight = []
        self.meta = []
        for w in range(self.workers):
            seg = self._create("inflight", inflight_nbytes(cap), w, reserve=0)
            self.inflight.append(InFlightTable.create(seg.buf, 0, cap, seg.reserver(), initial,
                                                      self.heaps[w].reserve_pages))
            path = meta.journal_path(self.data_path, self.prefix, w)
            self.meta.append(meta.Directory(path) if keep_journals else meta.Directory.create(path))
        self.inboxes = [channel_pair() for _ in range(self.workers)]
        for recv_end, _ in self.inboxes:
            os.set_blocking(recv_end.fileno(), False)
        self.stats_board = stats_plane.create_board(self._create("stats", Board.nbytes(self.workers)), self.workers)

    def _log_rings(self):
        """One line on the rings' sizes (--ring-budget), saying when the floor takes them past the budget."""
        rings = links.pub_rings(self.workers, self.producers)
        budget = getattr(self.opts, "ring_budget", links.RING_BUDGET)
        worst = rings * self.pub_capacity
        floor = f", raised to the {links.RING_FLOOR >> 10} KiB floor" if worst > budget else ""
        self.log.info(f"forwarding rings: {rings} x {self.pub_capacity >> 10} KiB (--ring-budget={budget}{floor}): "
                      f"{worst >> 20} MiB of /dev/shm at most, taken as they fill")

    def keep(self):
        """An unclean stop (a worker could not save its messages, or was killed): leave every segment and journal
        for the next start to salvage (``workers/storage/broker_crash.py``)."""
        self.log.warn(f"some messages could not be saved to disk; they stay in shared memory ({self.prefix}*) for "
                      f"the next start of nsqd on this data path")
        for seg in self.segments:
            seg.close()
        self.segments.clear()

    def destroy(self):
        for seg in self.segments:
            seg.close()
            seg.unlink()
        self.segments.clear()
        meta.remove_journals(self.data_path, self.prefix)
        for path in glob.glob(os.path.join(glob.escape(self.data_path), glob.escape(self.prefix.strip("/")) + "fwd-*")):
            os.unlink(path)  # large forwarded publishes a killed worker left (workers/processes/worker.py _forward_file)
        # what a child that had to be killed at shutdown could not remove itself (its topic logs)
        for name in list_segments(self.prefix):
            unlink_name(name)
        leftovers.forget(self.prefix)


def _heap_stride(capacity):
    """Bytes between two workers' heaps in the heaps segment (page-aligned: no page is shared)."""
    return align_up(heap_nbytes(capacity, capacity), mmap.PAGESIZE)


def _pages(ranges):
    """Bytes of the pages that payload byte ranges [start, end) touch, plus the segment's header page."""
    page = mmap.PAGESIZE
    touched = set()
    for start, end in ranges:
        if end > start:
            touched.update(range(start // page, (end + page - 1) // page))
    return PAYLOAD_OFFSET + page * len(touched)


def idle_shm_bytes(workers, external_producers=8, ring_budget=links.RING_BUDGET,
                   inflight_capacity=INFLIGHT_CAPACITY):
    """{segment kind: bytes of /dev/shm} that Plan.create reserves, i.e. what an idle broker's own segments hold
    (st_blocks): the model behind ARCHITECTURE.md's "Shared memory per broker"."""
    producers = workers + external_producers
    cap = inflight_capacity
    initial = min(INFLIGHT_INITIAL, cap)
    capacity = links.pub_capacity(ring_budget, workers, producers)
    inflight = _pages(inflight_reserved_ranges(cap, initial))
    stride = _heap_stride(cap)
    heaps = [(w * stride + a, w * stride + b)
             for w in range(workers) for a, b in heap_reserved_ranges(cap, cap, initial)]
    return {
        "control": PAYLOAD_OFFSET + align_up(control.nbytes(workers), mmap.PAGESIZE),
        "links": _pages([(0, links.fixed_nbytes(workers, producers, capacity))]),
        "inflight": workers * inflight,
        "heaps": _pages(heaps),
        "stats": PAYLOAD_OFFSET + align_up(Board.nbytes(workers), mmap.PAGESIZE),
    }
