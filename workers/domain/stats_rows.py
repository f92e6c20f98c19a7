"""A worker's side of the stats plane: its topics, channels and clients as rows other processes read.

Theory of operation
-------------------
The counters stay plain attributes of Topic, Channel and Session, incremented as before; nothing is hooked per
increment. Publication reads them and writes rows (``ipc/statrows.py``, schema in ``nsqpy/broker/stats.py``) for
what may have changed, compares each row with what it last wrote, and writes only the differences, in one batch
per kind of change (a kernel call each). What may have changed is known without looking at everything:

* topics: ``changed`` holds the names of topics touched since the last publication. It is filled by a few marks
  where a topic changes in ways its counters show: an append (``Topic.append``), a delivery pass, FIN, REQ,
  timeout or deferred message coming due (all go through the worker's ``pending`` channels, marked in
  ``Worker._idle``), a channel created or deleted (``Topic.get_channel``/``delete_channel``), a control command
  (pause, empty, delete: ``Worker.control_command``) and a topic created (``Worker.get_topic``). A name that no
  longer resolves (deleted topic) removes its rows.
* clients: every session the pump read from since the last publication (its ``last_read`` per fd, one numpy
  comparison: every command a client sends is a read), the consumers of the changed topics' channels (deliveries,
  timeouts), and sessions that arrived or left (a set difference, only when the worker's connection counter moved
  or the count differs).
So a worker with 100,000 idle topics pays nothing for them; a busy topic costs its rows once per publication.
A client's identity (IDENTIFY's results, its address, connect time) is written again only when its ``settings``
object or its ``stats_extra`` dict is replaced: that is how TLS and auth report what nsqd shows of them
(``tls_version``, ``tls_cipher_suite``, ``tls_negotiated_protocol[_is_mutual]``, ``authed``, ``auth_identity[_url]``):
a session sets ``stats_extra`` to a new dict when they change.

Registrations (what nsqlookupd is told) are published at once: a topic or channel created or deleted is marked
with ``structure_changed`` (``Worker.get_topic``/``delete_topic``, ``Topic.get_channel``/``delete_channel``), and
the ``poll`` of that loop iteration writes those topics' rows and then writes the lookupd link's eventfd
(``plan.lookupd_wake``: ``workers/processes/lookupd_link.py``), so the link registers within milliseconds instead of a
publication period later. Nothing of this runs per message, nor at all when nsqd registers with no lookupd.

When: ``poll`` runs at the end of every loop iteration (``Worker._idle``). Its fast path is one read of the
board's REQUEST word: a reader asking for fresh numbers is answered in that iteration (after the rings that
forward publishes were drained, or after REQUEST_GRACE if they never run empty, so that an OK'd forwarded publish
is counted). Otherwise a loop timer makes publication due every PERIOD, stretched so that periodic publication
takes at most COST_SHARE of the worker when much changes all the time; a due publication with nothing changed
costs a few microseconds. ``requested`` is part of the worker's "may I sleep" re-check (the eventfd wake-up
protocol of ``ipc/wake.py``), so a request that arrives while the worker goes to sleep is not missed: a reader
that holds the Plan wakes it through its eventfd, others with STATS_WAKE_SIGNAL, which the loop turns into an fd
event.

Cost per changed row: a topic's log numbers and all its channels' come from one kernel call (``_log_numbers``);
the rest is reading attributes and comparing a tuple; the batch goes to shared memory in one kernel call per kind
of change (measured in benchmarks/results/stats_snapshot.json: all_changed_publication_per_worker).

Errors: publication never takes the worker down; a failure (no /dev/shm for a bigger table) is logged once a
second and the readers keep the last rows. Deleted objects are freed in the same batch that writes their
replacements, after them.
"""
import gc
import json
import os
import time

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, warm_up_step
from nsqpy.ipc import msglog_kernels as MK
from nsqpy.ipc.msglog_layout import C_CURSOR, S_BACKLOG, S_BACKLOG_SEQ, S_HEAD, S_HEAD_SEQ, table_at
from nsqpy.ipc.statrows import COPY_A, R_BODY, RowWriter
from nsqpy.broker.stats import (KIND_CHANNEL, KIND_CLIENT, KIND_E2E, KIND_POLICY, KIND_PUB, KIND_TEXT, KIND_TOPIC,
                                POLICY_OVERFLOWS, STATS_WAKE_SIGNAL, U_COST_NS, U_DEFERRED, U_GC_RUNS, U_INFLIGHT, U_INFLIGHT_CAP, U_RSS,
                                U_TABLE_BLOCKED, U_WRITTEN, e2e_counters, encode_e2e, encode_name, encode_text,
                                table_name)
from nsqpy.workers.domain import e2e as E2E
from nsqpy.workers.domain.policy import Policy

__all__ = ["StatsPublisher", "STATS_WAKE_SIGNAL", "PERIOD", "warm_up"]

PERIOD = 0.1            # seconds between publications of what changed
REQUEST_GRACE = 0.05    # seconds a fresh request may wait for the forwarding rings to run empty
COST_SHARE = 0.05       # periodic publication takes at most this share of the worker (the period stretches)
_COPY_AT = COPY_A - R_BODY  # where the counters' first copy starts in a row body
_PAGE = os.sysconf("SC_PAGE_SIZE")
_OFF = Policy.OFF
_OVERFLOW_CODES = {name: i for i, name in enumerate(POLICY_OVERFLOWS)}


class _TopicRow:
    __slots__ = ("topic", "idx", "uid", "counters", "channels", "base", "order", "slots", "e2e", "e2e_last",
                 "e2e_key")

    def __init__(self, topic, idx, uid, counters):
        self.topic, self.idx, self.uid, self.counters, self.channels = topic, idx, uid, counters, {}
        self.base = 0           # messages the log had before this process counted any (a restarted worker)
        self.order = None       # the topic's channels as last published, and their log slots
        self.slots = None
        self.e2e = None         # its E2E rows (with --e2e-processing-latency-percentile), what they show, and of
        self.e2e_last = None    # which channel windows (and their versions) that was merged
        self.e2e_key = None


class _ChannelRow:
    __slots__ = ("channel", "idx", "uid", "counters", "e2e", "e2e_last", "pol", "pol_name", "pol_counters")

    def __init__(self, channel, idx, uid, counters):
        self.channel, self.idx, self.uid, self.counters = channel, idx, uid, counters
        self.e2e = self.e2e_last = None
        self.pol = self.pol_name = self.pol_counters = None   # its POLICY row (nsqpy's policies), when it has one


class _ClientRow:
    __slots__ = ("session", "idx", "uid", "counters", "settings", "extra", "text_ver", "text_len", "text_rows",
                 "pubs")

    def __init__(self, session, idx, uid):
        self.session, self.idx, self.uid = session, idx, uid
        self.counters = None
        self.settings = self.extra = None
        self.text_ver, self.text_len, self.text_rows = 0, 0, []
        self.pubs = {}  # topic -> [row index, count]


def _body(parent, named, counters):
    body = [parent] + named
    body += [0] * (_COPY_AT - len(body))
    return body + list(counters)


def _remote(remote):
    host, port = remote[0], remote[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class StatsPublisher:
    def __init__(self, worker, board):
        self.worker = worker
        plan = worker.plan
        self.rows = RowWriter(board, worker.index, lambda gen: table_name(plan.data_path, plan.node_id,
                                                                          worker.index, gen))
        self._req = board.request_view(worker.index)
        self._served = board.done(worker.index)  # requests made while this worker was down are answered first
        self.changed = set()        # names of topics that may have changed since the last publication
        self.structural = set()     # of those, topics created or deleted, or whose channels were: published at once
        self._lookupd_wake = getattr(plan, "lookupd_wake", None)  # the lookupd link's eventfd (None: no link)
        self._all = True            # the first publication covers every topic (a restarted worker has many)
        self._due = True
        self._since = 0.0           # monotonic time the last publication started (pump.last_read is compared)
        self._asked_at = 0.0        # when a pending request was first seen (REQUEST_GRACE)
        self._conn_seq = None
        self._failed_at = 0.0
        self._rss_at = 0.0
        self.topic_rows = {}        # name -> _TopicRow
        self.client_rows = {}       # conn_id -> _ClientRow
        self.channel_uid = {}       # Channel -> its row's uid (a consumer's row names its channel by uid)
        self._nums = np.empty(4 + 2 * 64, np.int64)
        self._cost = 0.0            # seconds the last publication that wrote rows took
        # --e2e-processing-latency-percentile (workers/domain/e2e.py): the quantiles, and per topic whose channels hold
        # latencies the monotonic time at which a window rotation may change its percentiles without a FIN
        self.e2e_quantiles = tuple(getattr(worker.opts, "e2e_processing_latency_percentile", None) or ())
        self._e2e_due = {}
        worker.loop.call_later(PERIOD, self._tick)

    # ---- when ------------------------------------------------------------------------------------------
    def _tick(self):
        self._due = True
        # at most ~COST_SHARE of the worker's time on periodic publication, however much changes all the time
        # (a reader asking for fresh numbers is answered at once all the same)
        self.worker.loop.call_later(max(PERIOD, self._cost / COST_SHARE), self._tick)

    def structure_changed(self, name):
        """Topic ``name`` was created or deleted, or a channel of it: publish it in this loop iteration and tell
        the lookupd link (module docstring); without a link, with the next publication as any change."""
        self.changed.add(name)
        if self._lookupd_wake is not None:
            self.structural.add(name)

    def requested(self):
        """A reader is waiting for a publication (one shared word)."""
        return self._req[0] != self._served

    def poll(self):
        """Once per loop iteration: publish if a reader asked or the period is over."""
        if self._req[0] != self._served:
            if not all(r.empty() for r in self.worker.pub_in):
                now = time.monotonic()
                if not self._asked_at:
                    self._asked_at = now
                if now - self._asked_at < REQUEST_GRACE:
                    if self.structural:
                        self.publish_structure()
                    return  # forwarded publishes are still coming in: count them first
            self.publish()
        elif self._due:
            self.publish()
        elif self.structural:
            self.publish_structure()

    def publish_structure(self):
        """Only the topics whose registrations changed (their rows and their channels'), then the lookupd
        link's wake-up; the rest (clients, other topics) waits for the next publication."""
        t0 = time.monotonic()
        names, self.structural = self.structural, set()
        for name in names:
            try:
                self._topic(name, [])
            except Exception as e:
                self._failed(t0, e)
        try:
            self.rows.flush()
        except Exception as e:
            self._failed(t0, e)
        self._wake_lookupd()

    def _wake_lookupd(self):
        if self._lookupd_wake is not None:
            try:
                os.eventfd_write(self._lookupd_wake, 1)
            except OSError:  # a full counter (the link reads it to zero at each wake-up): it is awake anyway
                pass

    def publish(self):
        t0 = time.monotonic()
        ticket = int(self._req[0])  # what is published now answers every request made before this point
        written = 0
        structural, self.structural = self.structural, set()  # their names are in ``changed`` too
        try:
            written = self._publish(t0)
        except Exception as e:  # e.g. no /dev/shm for a bigger table: readers keep the last rows, queued
            self._failed(t0, e)   # changes stay queued and go out with the next flush
        self.rows.done(ticket, time.time_ns())
        if structural:
            self._wake_lookupd()
        self._served = ticket
        self._due = False
        self._asked_at = 0.0
        self._since = t0
        if written:  # what the last publication that wrote anything cost (an idle one costs microseconds)
            self._cost = time.monotonic() - t0
            self.rows.set_user(U_COST_NS, int(self._cost * 1e9))
            self.rows.set_user(U_WRITTEN, written)

    # ---- what ------------------------------------------------------------------------------------------
    def _publish(self, t0):
        w = self.worker
        names, self.changed = self.changed, set()
        if self._all:
            names.update(w.topics)
            names.update(self.topic_rows)
            self._all = False
        if self._e2e_due:
            now = time.monotonic_ns()
            for name in [n for n, due in self._e2e_due.items() if due <= now]:
                del self._e2e_due[name]
                names.add(name)
        active = []
        for name in names:
            try:
                self._topic(name, active)
            except Exception as e:  # one topic's trouble must not keep the others (or the worker) from going on
                self.changed.add(name)
                self._failed(t0, e)
        for s in self._client_candidates(active):
            try:
                self._client(s)
            except Exception as e:
                self._failed(t0, e)
        written = self.rows.flush()
        if t0 - self._rss_at >= 1.0:
            self._rss_at = t0
            self._memory()
        return written

    def _failed(self, now, e):
        if now - self._failed_at >= 1.0:
            self._failed_at = now
            self.worker.log.error(f"worker {self.worker.index}: stats publication failed: {e!r}")

    def _client_candidates(self, active):
        w = self.worker
        out = {}
        sessions = w.sessions
        if w._conn_seq != self._conn_seq or len(sessions) != len(self.client_rows):
            self._conn_seq = w._conn_seq
            for cid in self.client_rows.keys() - sessions.keys():
                self._drop_client(self.client_rows.pop(cid))
            for cid in sessions.keys() - self.client_rows.keys():
                out[cid] = sessions[cid]
        pump = w.pump
        by_fd = pump.sessions
        for fd in np.flatnonzero(pump.last_read >= self._since).tolist():
            s = by_fd.get(fd)
            if s is not None:
                out[s.conn_id] = s
        for ch in active:
            for s in ch.consumers:
                out[s.conn_id] = s
        return [s for s in out.values() if not s.closed and sessions.get(s.conn_id) is s]

    # ---- topics and channels ---------------------------------------------------------------------------
    def _topic(self, name, active):
        t = self.worker.topics.get(name)
        tr = self.topic_rows.get(name)
        if tr is not None and (t is None or t.deleted or tr.topic is not t):
            self._drop_topic(self.topic_rows.pop(name))
            tr = None
        if t is None or t.deleted:
            return
        rows = self.rows
        log = t.log
        channels = [ch for ch in t.channels.values() if not ch.deleted]
        if tr is None or tr.order != channels:
            slots = np.array([ch.ch for ch in channels], np.int64)
        else:
            slots = tr.slots
        nums = self._nums if len(slots) * 2 + 4 <= len(self._nums) else np.empty(len(slots) * 2 + 4, np.int64)
        _log_numbers(log.ctrl, slots, nums)  # one kernel call for the topic's and its channels' log numbers
        head_seq, backlog_seq, backlog, head = nums[:4].tolist()
        depth = backend = 0
        if not channels:
            # nsqd hands a topic's messages to its channels at once; without channels they wait in the topic:
            # here, the backlog the first channel will take
            depth = max(0, head_seq - backlog_seq)
            backend = _on_disk(log, backlog, head, depth)
        if tr is None:
            # the log counts what was ever appended (it survives a worker restart), the topic what this process
            # did: a restarted worker's topic starts from the log's count
            base = max(0, head_seq - t.message_count)
            counters = (depth, backend, t.message_count + base, t.message_bytes, int(t.paused))
            idx, uid = rows.create(KIND_TOPIC, _body(0, encode_name(name), counters))
            tr = self.topic_rows[name] = _TopicRow(t, idx, uid, counters)
            tr.base = base
        else:
            counters = (depth, backend, t.message_count + tr.base, t.message_bytes, int(t.paused))
            if counters != tr.counters:
                rows.update(tr.idx, counters)
                tr.counters = counters
        tr.order, tr.slots = channels, slots
        chans = tr.channels
        k = 4
        for ch in channels:
            active.append(ch)
            queued, cursor = int(nums[k]), int(nums[k + 1])
            k += 2
            in_flight = 0
            for s in ch.consumers:
                in_flight += s.in_flight
            # depth as Channel.depth(): the log ahead of the cursor, requeued, and deferred messages come due
            counters = (queued + len(ch.requeued) + len(getattr(ch, "due", ())),
                        _on_disk(log, cursor, head, queued) if queued else 0, in_flight,
                        int(getattr(ch, "deferred_count", 0)), ch.message_count, ch.requeue_count,
                        ch.timeout_count, int(ch.paused))
            cr = chans.get(ch.name)
            if cr is not None and cr.channel is not ch:
                self._drop_channel(chans.pop(ch.name))
                cr = None
            if cr is None:
                idx, uid = rows.create(KIND_CHANNEL, _body(tr.uid, encode_name(ch.name), counters))
                cr = chans[ch.name] = _ChannelRow(ch, idx, uid, counters)
                self.channel_uid[ch] = uid
            elif counters != cr.counters:
                rows.update(cr.idx, counters)
                cr.counters = counters
            if ch.policy is not _OFF or cr.pol is not None or ch.dead_lettered_count or ch.expired_count \
                    or ch.dropped_count:
                self._policy(cr, ch)
        if len(chans) != len(channels):
            for cname in [c for c, cr in chans.items() if t.channels.get(c) is not cr.channel or cr.channel.deleted]:
                self._drop_channel(chans.pop(cname))  # deleted since (or replaced by a new channel of that name)
        if self.e2e_quantiles:
            self._e2e(name, tr, [chans[ch.name] for ch in channels])

    # ---- end-to-end latency (only with --e2e-processing-latency-percentile) --------------------------
    def _e2e(self, name, tr, crs):
        """The E2E rows of a topic's channels and of the topic (their merge; none without channels, as nsqd)."""
        now = time.monotonic_ns()
        q = self.e2e_quantiles
        windows = [(cr, getattr(cr.channel, "e2e", None)) for cr in crs]
        windows = [(cr, w) for cr, w in windows if w is not None]
        for cr in crs:
            w = getattr(cr.channel, "e2e", None)
            self._e2e_rows(cr, cr.uid, w.result(now) if w is not None else (0, (0,) * len(q)))
        if not crs:
            self._e2e_free(tr)
            tr.e2e_key = None
        else:
            key = tuple((cr.uid, w.version) for cr, w in windows)
            if key != tr.e2e_key or tr.e2e is None:
                tr.e2e_key = key
                self._e2e_rows(tr, tr.uid, E2E.merged_result([w for _, w in windows], q, now))
        due = [w.next_change_ns() for _, w in windows if w.holds_data()]
        if due:
            self._e2e_due[name] = min(due)
        else:
            self._e2e_due.pop(name, None)

    def _e2e_rows(self, holder, parent, result):
        if holder.e2e is None:
            holder.e2e = [self.rows.create(KIND_E2E, _body(parent, named, counters))[0]
                          for named, counters in zip(encode_e2e(self.e2e_quantiles), e2e_counters(*result))]
        elif result != holder.e2e_last:
            for idx, counters in zip(holder.e2e, e2e_counters(*result)):
                self.rows.update(idx, counters)
        holder.e2e_last = result

    def _e2e_free(self, holder):
        for idx in holder.e2e or ():
            self.rows.free(idx)
        holder.e2e = holder.e2e_last = None

    # ---- nsqpy's policies -------------------------------------------------------------------------------
    def _policy(self, cr, ch):
        """The channel's POLICY row: its effective policy and what it dropped, expired or dead-lettered (none while
        the policy is off and nothing was counted: a broker without policies writes none)."""
        p = ch.policy
        on = p != _OFF
        counts = (ch.dead_lettered_count, ch.expired_count, ch.dropped_count)
        if not on and not any(counts):
            self._policy_free(cr)
            return
        counters = counts + (p.max_attempts, p.message_ttl_ms, p.max_depth, p.max_bytes,
                             _OVERFLOW_CODES.get(p.overflow, 0), int(on))
        if cr.pol is None or cr.pol_name != p.dead_letter_topic:  # a name is written once: a new one, a new row
            self._policy_free(cr)
            cr.pol = self.rows.create(KIND_POLICY, _body(cr.uid, encode_name(p.dead_letter_topic), counters))[0]
            cr.pol_name = p.dead_letter_topic
        elif counters != cr.pol_counters:
            self.rows.update(cr.pol, counters)
        cr.pol_counters = counters

    def _policy_free(self, cr):
        if cr.pol is not None:
            self.rows.free(cr.pol)
            cr.pol = cr.pol_name = cr.pol_counters = None

    def _drop_channel(self, cr):
        self._policy_free(cr)
        self.rows.free(cr.idx)
        self._e2e_free(cr)
        self.channel_uid.pop(cr.channel, None)

    def _drop_topic(self, tr):
        for cr in tr.channels.values():
            self._drop_channel(cr)
        self._e2e_free(tr)
        self.rows.free(tr.idx)

    # ---- clients ---------------------------------------------------------------------------------------
    def _client(self, s):
        cr = self.client_rows.get(s.conn_id)
        rows = self.rows
        if cr is None:
            idx, uid = rows.create(KIND_CLIENT, _body(0, [], (0,) * 9))
            cr = self.client_rows[s.conn_id] = _ClientRow(s, idx, uid)
        extra = getattr(s, "stats_extra", None)
        if s.settings is not cr.settings or extra is not cr.extra:
            self._identity(cr, s, extra)
        ch = s.channel
        counters = (s.state, s.rdy, s.in_flight, s.message_count, s.finish_count, s.requeue_count, cr.text_ver,
                    cr.text_len, self.channel_uid.get(ch, 0) if ch is not None else 0)
        if counters != cr.counters:
            rows.update(cr.idx, counters)
            cr.counters = counters
        pump = self.worker.pump
        if s.pub_counts or cr.pubs or (pump.sessions.get(s.fd) is s and pump.tally[s.fd]):
            self._pubs(cr, s)  # (the pump's tally: its lone PUBs not yet folded into pub_counts)

    def _identity(self, cr, s, extra):
        """The client's identity text: written as new TEXT rows, the old ones freed (after, in the same batch)."""
        st = s.settings
        ident = {"client_id": st.client_id, "hostname": st.hostname, "user_agent": st.user_agent,
                 "remote_address": _remote(s.remote), "connect_ts": s.connect_ts, "sample_rate": st.sample_rate,
                 "deflate": st.deflate, "snappy": st.snappy, "tls": st.tls_v1,
                 "output_buffer_size": st.output_buffer_size, "output_buffer_timeout": st.output_buffer_timeout_ms,
                 "heartbeat_interval": st.heartbeat_interval_ms, "msg_timeout": st.msg_timeout_ms}
        if extra:
            ident.update(extra)  # what a session adds of its own (TLS details, auth identity)
        data = json.dumps(ident, separators=(",", ":")).encode()
        rows = self.rows
        for idx in cr.text_rows:
            rows.free(idx)
        cr.text_ver += 1
        cr.text_rows = [rows.create(KIND_TEXT, body)[0] for body in encode_text(cr.uid, cr.text_ver, data)]
        cr.text_len = len(data)
        cr.settings, cr.extra = st, extra

    def _pubs(self, cr, s):
        counts = s.pub_counts
        pump = self.worker.pump
        fd = s.fd
        if pump.sessions.get(fd) is s:
            t = int(pump.tally_topic[fd])
            n = int(pump.tally[fd])
            if t >= 0 and n:  # the pump's current run of lone PUBs, not yet folded into pub_counts
                counts = dict(counts)
                counts[pump.topics[t]] = counts.get(pump.topics[t], 0) + n
        rows = self.rows
        for topic, n in counts.items():
            p = cr.pubs.get(topic)
            if p is None:
                idx, _ = rows.create(KIND_PUB, _body(cr.uid, encode_name(topic), (n,) + (0,) * 8))
                cr.pubs[topic] = [idx, n]
            elif p[1] != n:
                rows.update(p[0], (n,) + (0,) * 8)
                p[1] = n

    def _drop_client(self, cr):
        rows = self.rows
        rows.free(cr.idx)
        for idx in cr.text_rows:
            rows.free(idx)
        for idx, _ in cr.pubs.values():
            rows.free(idx)

    def _memory(self):
        try:
            with open("/proc/self/statm", "rb") as f:
                rss = int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            rss = 0
        self.rows.set_user(U_RSS, rss)
        self.rows.set_user(U_GC_RUNS, sum(g["collections"] for g in gc.get_stats()))
        w = self.worker
        self.rows.set_user(U_INFLIGHT, len(w.inflight))
        self.rows.set_user(U_INFLIGHT_CAP, w.inflight.capacity)
        self.rows.set_user(U_TABLE_BLOCKED, len(w.table_blocked))
        self.rows.set_user(U_DEFERRED, len(w.deferred))

    def close(self):
        self.rows.close()


def _on_disk(log, start, head, count):
    """backend_depth: of the ``count`` public messages in [start, head), the share stored in disk-tier segments, in
    proportion to the bytes of that span that lie on disk. Exact when the span is all in memory (the usual case:
    0, without looking further) or all on disk; an estimate by bytes in between (the log keeps no per-segment
    message counts)."""
    if count <= 0 or head <= start or not getattr(log, "_count", (0, 0))[1]:
        return 0
    at = table_at(log.channels)
    table = log.ctrl[at:at + log.slots]
    disk = table[(table >= 0) & ((table & 1) == 1)] >> 1
    if not len(disk):
        return 0
    size = log.segment_size
    lo = np.maximum(disk * size, start)
    hi = np.minimum((disk + 1) * size, head)
    on_disk = int(np.clip(hi - lo, 0, None).sum())
    return min(count, round(count * on_disk / (head - start)))


@njit(nogil=True, **JIT)
def _log_numbers(ctrl, slots, out):
    """A topic's log numbers other processes could read too, in one call: head seq, backlog seq, backlog
    position, head position, then per channel slot its depth (public after the cursor and its private records)
    and its cursor."""
    out[0] = MK.state_snapshot(ctrl, S_HEAD_SEQ)
    out[1] = MK.state_snapshot(ctrl, S_BACKLOG_SEQ)
    out[2] = MK.state_snapshot(ctrl, S_BACKLOG)
    out[3] = MK.state_snapshot(ctrl, S_HEAD)
    for k in range(slots.size):
        out[4 + 2 * k] = max(MK.channel_depth(ctrl, slots[k]), 0)  # a slot closed meanwhile: nothing queued
        out[5 + 2 * k] = MK.cursor_snapshot(ctrl, slots[k], C_CURSOR)


@warm_up_step
def warm_up():
    """Compile (or load) this module's kernel in the supervisor before fork (workers/lane/warmup.py), and the FIN
    hook's of workers/domain/e2e.py."""
    from nsqpy.ipc.msglog_layout import ctrl_nbytes
    ctrl = np.zeros(ctrl_nbytes(1, 1) // 8, np.int64)
    _log_numbers(ctrl, np.zeros(1, np.int64), np.zeros(6, np.int64))
    E2E.warm_up()
