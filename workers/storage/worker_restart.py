"""A replacement worker picking up after its predecessor died: the topic directory, the logs, the in-flight
table, the deferred store, and what the dead process was doing (poison records, ``workers/storage/poison.py``).

A mixin of ``nsqpy.workers.processes.worker.Worker``; it runs from ``Worker.__init__`` when the worker was forked again after a
crash. Theory of operation: ARCHITECTURE.md, "Crash behaviour".
"""


from nsqpy.ipc import inflight as IF
from nsqpy.workers.processes.scanner import RESET
from nsqpy.workers.storage.poison import DELIVERY as DELIVERY_SUSPECT, FORWARD as FORWARD_SUSPECT, quarantine_file
from nsqpy.workers.domain.topic import Topic



class Recovery:
    # ---- the topic directory and recovery --------------------------------------------------------------
    def _after_crash(self):
        """Read what the dead predecessor was doing (workers/storage/poison.py): a delivery round makes its channel
        careful, a record that crashed it twice is set aside."""
        kind, a, key, pos, count = self.suspect.left_behind()
        if kind == DELIVERY_SUSPECT:
            ch = self.channels_by_key.get(key)
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
                self._fwd_poison = (a, count)
            else:
                # its drain appended runs of records, and ``count`` names a run's first: drain that ring one
                # record at a time once, so that a second crash names the record itself
                self._fwd_careful = a

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

    def _recover(self):
        from nsqpy.workers.domain.channel import Channel
        doc = self.directory.read() or {"topics": []}
        self._topic_seq = doc.get("topic_seq", 0)
        self._channel_seq = doc.get("channel_seq", 0)
        for td in doc["topics"]:
            t = Topic.__new__(Topic)
            try:
                Topic.__init__(t, self, td["name"], td["index"], restarted=True)
            except Exception as e:
                # e.g. deleted by the dead process after its last recorded change: a topic that cannot be
                # re-attached must not take the worker's other topics down with it (a crash loop)
                self.log.error(f"worker {self.index}: TOPIC({td['name']}) cannot be recovered: {e!r}")
                continue
            t.paused = td["paused"]
            self.topics[t.name] = t
            self.topics_by_index[t.index] = t
            for cd in td["channels"]:
                ch = Channel(t, cd["name"], cd["ch"], cd["key"])
                ch.paused = cd["paused"]
                t.channels[ch.name] = ch
                self.channels_by_key[ch.key] = ch
            known = {c.ch for c in t.channels.values()}
            for slot in t.log.open_channels():
                if slot not in known:  # opened by the dead process just before it could record it
                    t.log.close_channel(slot)
        table = self.inflight
        self._send_scanner(RESET, b"")
        deferred, dues = [], []
        for slot in table.recover().tolist():
            info = table.slot(slot)
            ch = self.channels_by_key.get(info.channel)
            if ch is None:
                table.release(slot)
            elif info.state == IF.DEFERRED:
                deferred.append(slot)
                dues.append(info.deadline_ns)
            else:
                if info.state == IF.IN_FLIGHT:
                    table.requeue(slot, 0)
                ch.requeued.append((slot, 0))  # held before the crash: ahead of what waits in the log
        self.timer_start_each(deferred, dues)
        self._recover_deferred()
        self.touched.update(self.topics.values())  # set every low-water mark once from the recovered table
        self.log.info(f"worker {self.index}: recovered {len(self.topics)} topics after a restart")
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
            if key not in self.channels_by_key or (key, msg_id) in seen \
                    or table.lookup(key, msg_id, -2) != IF.ST_NOT_FOUND:
                drop.append(i)
            seen.add((key, msg_id))
        self.deferred.free(drop)
        self.deferred_changed()
        self.log.info(f"worker {self.index}: recovered {len(idx) - len(drop)} deferred messages")
