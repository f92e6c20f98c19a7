"""The policy file: the per-topic and per-channel configs of nsqpy's policies (``workers/domain/policy.py``), kept in
the data path in a file of nsqpy's own (Go nsqd ignores it, so the data path stays readable by Go nsqd):

    <data-path>/nsqpy-policies.json   {"version": 1, "topics": {T: config}, "channels": {T: {C: config}}}

Each config holds only the fields that were set explicitly (``POST /topic/config``, ``POST /channel/config``); a
config that becomes empty is left out, and so is a topic with neither a config nor a channel config. The flags'
defaults are not in the file (they are the options'), so a restart with other flags changes every value that no
config overrides.

Theory of operation
-------------------
* Writers are the HTTP API's gunicorn workers (forked, each with its own threads): ``PolicyBook.update`` takes a
  POSIX record lock (``fcntl.lockf``, on ``nsqpy-policies.lock`` beside the file; a record lock is per process, so
  the threads of a process also take one thread lock), re-reads the file, applies the change, writes the whole file to a temporary
  file, fsyncs it, renames it over the old one and fsyncs the directory, then releases the lock. So concurrent
  updates from any number of processes and threads are serialised and none is lost, and a reader (who takes no
  lock) sees either the old file or the new one, whole.
* The reader is the owner worker of a topic: its ``PolicyBook`` is loaded when the worker starts (also a replacement
  after a worker SIGKILL, and the salvage children after a whole-broker crash), and again when the HTTP API tells it
  a topic's config changed (the ``policy_changed`` control command, sent after the file is written), so a command
  that reaches a replacement worker finds the change in the file already.
* A file that cannot be read as a policy file (damaged by hand) is logged and renamed ``.bad``; the broker runs with
  no configs rather than not at all.

Cost: one small file per data path, read once per worker start and once per config change; ``effective`` is two
dict lookups and, when something is configured, one ``resolve``.
"""
from __future__ import annotations

import fcntl
import json
import os
import threading

from nsqpy.workers.domain.policy import FIELDS, Policy, PolicyError, flag_defaults, merge, parse_config, resolve, \
    suffix_of

FILE_NAME = "nsqpy-policies.json"
LOCK_NAME = "nsqpy-policies.lock"
VERSION = 1

# A POSIX record lock is held by a process, not a thread: the threads of one process (every PolicyBook in it) take
# this lock around it. A child forked while another thread held it gets a fresh one.
_process_lock = threading.Lock()


def _fresh_lock_after_fork():
    global _process_lock
    _process_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)


def policy_path(data_path):
    return os.path.join(data_path, FILE_NAME)


class PolicyBook:
    """The configs of one data path, the flags' defaults, and the effective Policy of any topic or channel."""

    def __init__(self, data_path, opts, log=None):
        self.data_path = data_path
        self.path = policy_path(data_path)
        self.lock_path = os.path.join(data_path, LOCK_NAME)
        self.defaults = flag_defaults(opts)
        self.suffix = suffix_of(opts)
        self.log = log
        self.topics = {}      # topic -> its config
        self.channels = {}    # topic -> {channel: its config}

    # ---- reading ---------------------------------------------------------------------------------------
    def load(self):
        """Read the file (none: no configs). -> self. A file that cannot be opened (permissions, I/O error) is
        logged and read as no configs: a worker must start all the same (an update then fails: the HTTP API's
        500)."""
        with _process_lock:
            try:
                self.topics, self.channels = self._read()
            except OSError as e:
                if self.log is not None:
                    self.log.error(f"policy file {self.path} cannot be read ({e}): no configs in effect")
                self.topics, self.channels = {}, {}
        return self

    def _read(self):
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}, {}
        try:
            return _parse_file(raw)
        except (ValueError, PolicyError) as e:
            bad = self.path + ".bad"
            if self.log is not None:
                self.log.error(f"policy file {self.path} cannot be read ({e}): renamed {bad}, no configs in effect")
            try:
                os.replace(self.path, bad)
            except OSError:
                pass
            return {}, {}

    def topic_config(self, topic):
        return self.topics.get(topic, {})

    def channel_config(self, topic, channel):
        return self.channels.get(topic, {}).get(channel, {})

    def effective(self, topic, channel=None):
        """The effective Policy of ``channel`` of ``topic`` (None: of the topic itself): flags < topic < channel."""
        topic_config = self.topics.get(topic)
        channel_config = None if channel is None else self.channels.get(topic, {}).get(channel)
        if not (self.defaults or topic_config or channel_config):
            return Policy.OFF
        return resolve(topic, self.defaults, topic_config, channel_config, self.suffix)

    def describe(self, topic, channel=None):
        """What ``GET /topic/config`` and ``/channel/config`` answer: the effective values and the configs set."""
        out = {"topic": topic}
        if channel is not None:
            out["channel"] = channel
        out["effective"] = self.effective(topic, channel).to_json()
        out["config"] = dict(self.topic_config(topic) if channel is None else self.channel_config(topic, channel))
        if channel is not None:
            out["topic_config"] = dict(self.topic_config(topic))
        else:  # the topic's channels that have a config of their own, so an operator can find them
            out["channel_configs"] = {name: dict(c) for name, c in sorted(self.channels.get(topic, {}).items())}
        out["defaults"] = dict(self.defaults)
        return out

    # ---- writing ---------------------------------------------------------------------------------------
    def update(self, topic, channel, body, valid_topic_name):
        """Apply a config body (bytes of a JSON object; parse_config raises PolicyError for a bad one) to the
        topic's (channel None) or the channel's config, in the file, under the lock; -> ``describe`` of it after.
        Raises OSError when the file cannot be written (nothing changed then)."""
        changes = parse_config(body, valid_topic_name)
        with _process_lock, open(self.lock_path, "a+b") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)
            try:
                self.topics, self.channels = self._read()
                if changes:
                    if channel is None:
                        _set(self.topics, topic, merge(self.topics.get(topic), changes))
                    else:
                        per_topic = self.channels.setdefault(topic, {})
                        _set(per_topic, channel, merge(per_topic.get(channel), changes))
                        if not per_topic:
                            del self.channels[topic]
                    self._write()
            finally:
                fcntl.lockf(lock, fcntl.LOCK_UN)
        return self.describe(topic, channel)

    def _write(self):
        doc = {"version": VERSION, "topics": self.topics, "channels": self.channels}
        data = json.dumps(doc, sort_keys=True, indent=1).encode() + b"\n"
        tmp = f"{self.path}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        dfd = os.open(self.data_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _set(configs, name, config):
    if config:
        configs[name] = config
    else:
        configs.pop(name, None)


def _parse_file(raw):
    """The file's text -> (topics, channels), every config checked as a POST body would be."""
    doc = json.loads(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("topics", {}), dict) \
            or not isinstance(doc.get("channels", {}), dict):
        raise ValueError("not a policy file")
    topics = {name: _checked(config) for name, config in doc.get("topics", {}).items()}
    channels = {}
    for topic, per_topic in doc.get("channels", {}).items():
        if not isinstance(per_topic, dict):
            raise ValueError(f"channels of {topic!r} are not an object")
        channels[topic] = {name: _checked(config) for name, config in per_topic.items()}
    return ({k: v for k, v in topics.items() if v},
            {t: {c: v for c, v in cs.items() if v} for t, cs in channels.items() if any(cs.values())})


def _checked(config):
    if not isinstance(config, dict):
        raise ValueError("a config is not an object")
    parsed = parse_config(json.dumps(config).encode(), lambda name: True)
    return {k: v for k, v in parsed.items() if v is not None and k in FIELDS}


__all__ = ["PolicyBook", "FILE_NAME", "policy_path"]
