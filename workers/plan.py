"""Everything the broker's processes share, created by the supervisor before it forks anything.

Theory of operation: the supervisor builds one ``Plan``: the listening socket, one fd hand-over channel per worker
(``ipc.fdpass``), one eventfd per reading process, and the shared-memory segments:

    control     per-process words: connections served, restarts, the scanner epoch   (workers/control.py)
    links       the SPSC rings: worker i -> worker j (forwarded publishes, i != j), worker i -> scanner,
                scanner -> worker i                                                  (workers/links.py)
    inflight-i  worker i's in-flight table                                           (ipc/inflight.py)
    heaps       one timer heap per worker, the scanner's                             (ipc/heap.py)
and one journal file per worker under the data path: worker i's topic and channel directory, to find its logs after
a restart (``workers/meta.py``).

Children inherit the Plan through fork, mappings included: a restarted child is forked from the supervisor again
and so finds every segment exactly where its predecessor left it. Segments are created by the supervisor, which
unlinks them at shutdown (``destroy``). Topic logs are created by their owner worker, which
destroys them at clean shutdown.
"""
import glob
import os
import socket

from ipc.fdpass import channel_pair
from ipc.heap import TimerHeap, heap_nbytes
from ipc.inflight import InFlightTable, inflight_nbytes
from ipc.shm import (Segment, find_dead_instances, instance_prefix, list_segments, remove_segments, segment_name,
                     unlink_name)
from workers import control, links, meta

INFLIGHT_CAPACITY = 1 << 17


class Plan:
    def __init__(self, opts, log):
        self.opts = opts
        self.log = log
        self.workers = max(1, opts.workers)
        self.data_path = opts.data_directory()
        self.node_id = opts.node_id
        self.prefix = instance_prefix(self.data_path, self.node_id)
        self.segments = []
        self.listener = None
        self.inboxes = []          # (receiving end, sending end) per worker
        self.link_set = None
        self.control = None

    # ---- creation (supervisor, before fork) ------------------------------------------------------------
    def name(self, kind, index=0):
        return segment_name(self.data_path, self.node_id, kind, index)

    def _create(self, kind, size, index=0):
        seg = Segment.create(self.name(kind, index), size)
        self.segments.append(seg)
        return seg

    def remove_stale(self):
        """Segments of every dead broker instance on this host (ours after a crash, or any other data path's and
        node id's): an instance is dead once its supervisor is (``ipc.shm.find_dead_instances``). Recovering
        their messages belongs to persistence; for now they are removed, never reused."""
        dead = find_dead_instances()
        if not dead:
            return
        count, nbytes = remove_segments(name for names in dead.values() for name in names)
        instances = ", ".join(f"{prefix.strip('/-')} ({len(names)})" for prefix, names in dead.items())
        self.log.warn(f"removed {count} shared-memory segments ({nbytes / (1 << 20):.1f} MiB) of dead instances "
                      f"{instances}")

    def create(self):
        self.remove_stale()
        self.control = control.Control.create(self._create("control", control.nbytes(self.workers)), self.workers)
        self.link_set = links.LinkSet.create(self._create("links", links.nbytes(self.workers)), self.workers)
        self.inflight = []
        self.meta = []
        for w in range(self.workers):
            seg = self._create("inflight", inflight_nbytes(INFLIGHT_CAPACITY), w)
            self.inflight.append(InFlightTable.create(seg.buf, 0, INFLIGHT_CAPACITY))
            self.meta.append(meta.Directory.create(meta.journal_path(self.data_path, self.prefix, w)))
        size = heap_nbytes(INFLIGHT_CAPACITY, INFLIGHT_CAPACITY)
        heaps = self._create("heaps", self.workers * size)
        self.heaps = [TimerHeap.create(heaps.buf, w * size, INFLIGHT_CAPACITY, INFLIGHT_CAPACITY)
                      for w in range(self.workers)]
        self.inboxes = [channel_pair() for _ in range(self.workers)]
        for recv_end, _ in self.inboxes:
            os.set_blocking(recv_end.fileno(), False)

    def bind(self):
        host, port = split_address(self.opts.tcp_address)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.set_inheritable(True)
        self.listener = sock
        return sock.getsockname()[:2]

    def destroy(self):
        for seg in self.segments:
            seg.close()
            seg.unlink()
        self.segments.clear()
        meta.remove_journals(self.data_path, self.prefix)
        for path in glob.glob(os.path.join(glob.escape(self.data_path), glob.escape(self.prefix.strip("/")) + "fwd-*")):
            os.unlink(path)  # large forwarded publishes a killed worker left (workers/worker.py _forward_file)
        # what a child that had to be killed at shutdown could not remove itself (its topic logs)
        for name in list_segments(self.prefix):
            unlink_name(name)


def split_address(addr):
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
