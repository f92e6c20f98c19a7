"""Poison records: what a worker was doing when it died, and setting aside a record that kills its owner twice.

Theory of operation
-------------------
A record that crashes the process that handles it (a bug in a kernel, a corrupt segment: a SIGSEGV or SIGBUS, not
an exception, which the worker catches) would crash every replacement too: the replacement recovers the same
record and handles it again. The supervisor's back-off keeps that from spinning, but the worker's other topics
would be down for good. So before each risky step a worker writes what it is about to touch into its own words of
the control block (``Suspect``: plain stores into shared memory, which survive the process), and clears them when
the step is done. A replacement reads what its predecessor left there:

* a **delivery round** (topic, channel key, first record's log position, how many records): if the round held
  several records, the channel is delivered one record per round (``careful``) for as many records, so the next
  crash names the record alone; a record that crashes its owner alone while the channel is careful has crashed it
  twice, and is set aside.
* a **forwarded publish** (source worker, the ring's release position when the drain began, index in the batch):
  the same record crashing two owners in a row is set aside.

Setting aside = its body is written to ``<data-path>/quarantine/`` (kept for inspection, with the topic, channel and
message id in the file name), it is taken out of delivery (the channel's cursor passes it, or its in-flight slot is
released; a forwarded record is released from the ring), it is counted (``quarantined``) and logged. A message set
aside this way was acknowledged and is not delivered: this is the one loss the broker accepts, in exchange for the
rest of the worker's topics.

Layout: words 2.. of the worker's line in the control block (``workers/control/block.py``, one writer: the worker).
"""
import os
import re

from nsqpy.ipc.atomics import py_fetch_add

DELIVERY, FORWARD = 1, 2
# word offsets inside the worker's control line (0 and 1 are connections and restarts)
KIND, TOPIC, KEY, POS, COUNT, CAREFUL_KEY, CAREFUL_LEFT, QUARANTINED, LAST_FWD_SRC, LAST_FWD_POS, LAST_FWD_K = \
    range(2, 13)
QUARANTINE_DIR = "quarantine"


class Suspect:
    """The worker's suspect words: what it is doing now, and the careful mode that survives its crashes."""

    def __init__(self, words, base):
        self.w = words
        self.base = base

    def _get(self, field):
        return int(self.w[self.base + field])

    def _set(self, field, value):
        self.w[self.base + field] = value

    def begin(self, kind, topic, key, pos, count):
        b = self.base
        self.w[b + TOPIC], self.w[b + KEY], self.w[b + POS], self.w[b + COUNT] = topic, key, pos, count
        self.w[b + KIND] = kind

    def end(self):
        self.w[self.base + KIND] = 0

    def left_behind(self):
        """What the dead predecessor was doing: (kind, topic, key, pos, count), kind 0 for nothing; cleared."""
        got = tuple(self._get(f) for f in (KIND, TOPIC, KEY, POS, COUNT))
        self.end()
        return got

    # careful mode: one record per delivery round on one channel, for a number of records
    def careful_rounds(self, key):
        """How many single-record rounds channel ``key`` still owes (0: deliver normally)."""
        return self._get(CAREFUL_LEFT) if self._get(CAREFUL_KEY) == key else 0

    def set_careful(self, key, rounds):
        self._set(CAREFUL_LEFT, 0)
        self._set(CAREFUL_KEY, key)
        self._set(CAREFUL_LEFT, rounds)

    def careful_done(self):
        left = self._get(CAREFUL_LEFT) - 1
        self._set(CAREFUL_LEFT, max(left, 0))

    def forwarded_again(self, src, pos, k):
        """A forwarded record killed the previous owner: True if the same record killed the one before it too
        (then it is set aside); otherwise remember it for next time."""
        if (self._get(LAST_FWD_SRC), self._get(LAST_FWD_POS), self._get(LAST_FWD_K)) == (src + 1, pos, k):
            return True
        self._set(LAST_FWD_SRC, src + 1)
        self._set(LAST_FWD_POS, pos)
        self._set(LAST_FWD_K, k)
        return False

    def count_quarantined(self):
        py_fetch_add(self.w, self.base + QUARANTINED, 1)

    @property
    def quarantined(self):
        return self._get(QUARANTINED)


def quarantine_file(data_path, what, body):
    """Write a set-aside body to <data_path>/quarantine/<what>.msg; -> the path."""
    directory = os.path.join(data_path, QUARANTINE_DIR)
    os.makedirs(directory, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._#-]", "_", what)
    path = os.path.join(directory, f"{name}.msg")
    with open(path, "wb") as f:
        f.write(body)
    return path
