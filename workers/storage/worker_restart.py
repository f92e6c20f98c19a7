"""A replacement worker picking up after its predecessor died: the topic directory, the logs, the in-flight
table, the deferred store, and what the dead process was doing (poison records, ``workers/storage/poison.py``).

``Restart`` is one part of ``nsqpy.workers.processes.worker.Worker``, used once, from ``Worker.__init__``, when the
worker was forked again after a crash (``recover``, then ``after_crash``). It has no state of its own; it is built
with what it uses: the worker's index, data path and log, the control block, the suspect words, the in-flight
table, the deferred store, the topic journal (``read``) and three parts through narrow interfaces: the topic table
(``RecoveredTopics``), the deadlines (``RestartTimers``) and the forwarder (``ForwardDrain``).
Theory of operation: ARCHITECTURE.md, "Crash behaviour".
"""
from typing import Mapping, Protocol

from nsqpy.ipc import inflight as IF
from nsqpy.workers.processes.scanner import RESET
from nsqpy.workers.storage.poison import DELIVERY as DELIVERY_SUSPECT, FORWARD as FORWARD_SUSPECT, quarantine_file


class RecoveredTopics(Protocol):
    """The topic table (``workers/domain/topics.py``): re-attaches the journal's topics and channels."""
    topics: Mapping
    channels_by_key: Mapping

    def recover(self, doc: dict) -> None: ...


class RestartTimers(Protocol):
    """The deadlines (``workers/timing/deadlines.py``): the scanner's reset and the recovered timers."""

    def send_scanner(self, rtype: int, payload: bytes, key=None) -> None: ...

    def timer_start_each(self, slots, keys) -> None: ...

    def deferred_changed(self) -> None: ...


class ForwardDrain(Protocol):
    """The forwarder (``workers/publishing/forwarding.py``): how its next drain of an input ring goes."""

    def set_aside_forwarded(self, link: int, index: int) -> None: ...

    def drain_carefully(self, link: int) -> None: ...


class Restart:
    def __init__(self, index, data_path, log, control, suspect, inflight, deferred, directory,
                 table: RecoveredTopics, deadlines: RestartTimers, forwarder: ForwardDrain):
        self.index = index
        self.data_path = data_path
        self.log = log
        self.control = control
        self.suspect = suspect
        self.inflight = inflight
        self.deferred = deferred
        self.directory = directory
        self.table = table
        self.deadlines = deadlines
        self.forwarder = forwarder

    # ---- the topic directory and recovery --------------------------------------------------------------
    def after_crash(self):
        """Read what the dead predecessor was doing (workers/storage/poison.py): a delivery round makes its channel
        careful, a record that crashed it twice is set aside."""
        kind, a, key, pos, count = self.suspect.left_behind()
        if kind == DELIVERY_SUSPECT:
            ch = self.table.channels_by_key.get(key)
            if ch is None:
                return
            if count == 1 and self.suspect.careful_rounds(key) > 0:
                self._set_aside(ch, pos)
                self.suspect.set_careful(0, 0)
            else:
                # deliver this channel one message per round until the suspect round's messages (now requeued,
                # with whatever else was in flight) have gone out alone: the next crash names the message
                self.suspect.set_careful(key, count + len(ch.requeued))
                self.log.warn(f"worker {self.index}: died delivering {count} messages of {ch.topic.name}/"
                              f"{ch.name}; delivering them one at a time")
        elif kind == FORWARD_SUSPECT:
            if self.suspect.forwarded_again(a, pos, count):
                self.forwarder.set_aside_forwarded(a, count)
            else:
                # its drain appended runs of records, and ``count`` names a run's first: drain that ring one
                # record at a time once, so that a second crash names the record itself
                self.forwarder.drain_carefully(a)

    def _set_aside(self, ch, pos):
        """Take the message at log position pos out of channel ch's delivery and keep its body on disk."""
        log = ch.topic.log
        table = self.inflight
        for entry in list(ch.requeued):
            slot = entry[0]
            if table.slot(slot).log_pos == pos:
                ch.requeued.remove(entry)
                break
        else:
            slot = None
        msg_id = int(log.records_at([pos]).ids[0]) & 0xFFFFFFFFFFFFFFFF
        path = quarantine_file(self.data_path, f"{ch.topic.name}.{ch.name}.{msg_id:016x}", log.body(pos))
        if slot is not None:
            table.release(slot)
        elif log.cursor(ch.ch) == pos:
            log.advance(ch.ch, log.read(ch.ch, 1, 1 << 62).next_position)
        self.suspect.count_quarantined()
        self.log.error(f"worker {self.index}: message {msg_id:016x} of {ch.topic.name}/{ch.name} crashed this "
                       f"worker twice; set aside in {path}")

    def recover(self):
        """Re-attach the topics, requeue what was in flight at the dead process, restore timers and the deferred
        store. (The caller marks every topic's low-water marks for the next reclaim pass.)"""
        self.table.recover(self.directory.read() or {"topics": []})
        channels_by_key = self.table.channels_by_key
        table = self.inflight
        self.deadlines.send_scanner(RESET, b"")
        deferred, dues = [], []
        for slot in table.recover().tolist():
            info = table.slot(slot)
            ch = channels_by_key.get(info.channel)
            if ch is None:
                table.release(slot)
            elif info.state == IF.DEFERRED:
                deferred.append(slot)
                dues.append(info.deadline_ns)
            elif ch.recover_held(slot):
                pass  # its dead letter was under way: sent again, never delivered again (workers/domain/dead_letter.py)
            else:
                if info.state == IF.IN_FLIGHT:
                    table.requeue(slot, 0)
                ch.requeued.append((slot, 0))  # held before the crash: ahead of what waits in the log
        self.deadlines.timer_start_each(deferred, dues)
        self._recover_deferred()
        self.log.info(f"worker {self.index}: recovered {len(self.table.topics)} topics after a restart")
        self.control.set_connections(self.index, 0)
        self.control.set_moved_in(self.index, 0)  # the producers moved here died with the worker

    def _recover_deferred(self):
        """Rebuild the deferred store's derived state and drop what a crash left doubled: an entry whose message
        also has an in-flight slot (the slot delivers it), a second entry for one (message, channel) (the cursor
        was re-read), or one whose channel is gone."""
        idx = self.deferred.recover()
        if not len(idx):
            return
        _, channels, ids, _, _, _ = self.deferred.fields(idx)
        drop, seen = [], set()
        table = self.inflight
        for i, key, msg_id in zip(idx.tolist(), channels.tolist(), ids.tolist()):
            if key not in self.table.channels_by_key or (key, msg_id) in seen \
                    or table.lookup(key, msg_id, -2) != IF.ST_NOT_FOUND:
                drop.append(i)
            seen.add((key, msg_id))
        self.deferred.free(drop)
        self.deadlines.deferred_changed()
        self.log.info(f"worker {self.index}: recovered {len(idx) - len(drop)} deferred messages")
