"""Policies without a broker (issue 49): resolution (flags < topic < channel), config bodies, the policy file
(``workers/storage/policy_file.py``: atomic, locked read-modify-write from several processes and threads), and the
stats plane's and options' copies of the overflow names."""
from __future__ import annotations

import json
import multiprocessing
import os
import threading
from types import SimpleNamespace

import pytest

from nsqpy.broker.stats import POLICY_OVERFLOWS
from nsqpy.config import NsqdOptions
from nsqpy.config.nsqd import CHANNEL_OVERFLOW
from nsqpy.protocol.names import is_valid_name
from nsqpy.workers.domain.policy import (DEFAULT_SUFFIX, FIELDS, OVERFLOWS, Policy, PolicyError, flag_defaults, merge,
                                         parse_config, resolve, suffix_of)
from nsqpy.workers.control import commands as CMD
from nsqpy.workers.domain.topics import TopicTable
from nsqpy.workers.storage.policy_file import FILE_NAME, PolicyBook
from tests.workers.worker_fakes import (FailureReports, FakeLog, RecordingJournal, RecordingStats, TableChannel,
                                        TableHost, TableTopic, topic_owned_by)

MS = 1_000_000


def test_the_overflow_names_are_one_list():
    assert POLICY_OVERFLOWS == OVERFLOWS
    assert set(CHANNEL_OVERFLOW.choices) == set(OVERFLOWS)


@pytest.mark.parametrize("argv, defaults", [
    ([], {}),
    (["--max-attempts=5"], {"max_attempts": 5}),
    (["--message-ttl=1500ms"], {"message_ttl_ms": 1500}),
    (["--message-ttl=1.9ms"], {"message_ttl_ms": 1}),             # whole ms, truncated as Go's d / time.Millisecond
    (["--max-channel-depth=10", "--max-channel-bytes=4096"], {"max_depth": 10, "max_bytes": 4096}),
    (["--channel-overflow=drop_oldest"], {"overflow": "drop_oldest"}),
    (["--channel-overflow=block"], {}),                             # the default is not a setting
])
def test_flag_defaults(argv, defaults):
    assert flag_defaults(NsqdOptions.parse(argv)) == defaults


def test_suffix_of():
    assert suffix_of(NsqdOptions.parse([])) == DEFAULT_SUFFIX == ".dead"
    assert suffix_of(NsqdOptions.parse(["--dead-letter-topic-suffix=_dlq"])) == "_dlq"


@pytest.mark.parametrize("topic, defaults, tc, cc, expected", [
    ("t", {}, None, None, Policy.OFF),
    ("t", {}, {}, {}, Policy.OFF),
    ("t", {"max_attempts": 3}, None, None, Policy(max_attempts=3, dead_letter_topic="t.dead")),
    # topic over flags, channel over topic
    ("t", {"max_attempts": 3}, {"max_attempts": 5}, None, Policy(max_attempts=5, dead_letter_topic="t.dead")),
    ("t", {"max_attempts": 3}, {"max_attempts": 5}, {"max_attempts": 7},
     Policy(max_attempts=7, dead_letter_topic="t.dead")),
    # a channel's field falls back to its topic's, field by field
    ("t", {}, {"message_ttl_ms": 10, "overflow": "reject", "max_depth": 4}, {"max_depth": 9},
     Policy(message_ttl_ms=10, max_depth=9, overflow="reject")),
    # an explicit dead-letter topic wins over the implied one; without max_attempts none is implied
    ("t", {}, {"max_attempts": 2, "dead_letter_topic": "graveyard"}, None,
     Policy(max_attempts=2, dead_letter_topic="graveyard")),
    ("t", {}, {"message_ttl_ms": 10}, None, Policy(message_ttl_ms=10)),
    # a channel may turn its topic's off with 0
    ("t", {}, {"max_attempts": 2}, {"max_attempts": 0}, Policy(max_attempts=0)),
    # the flags do not apply to a dead-letter topic; its own config does
    ("t.dead", {"max_attempts": 3}, None, None, Policy.OFF),
    ("t.dead", {"max_attempts": 3}, {"max_attempts": 1}, None,
     Policy(max_attempts=1, dead_letter_topic="t.dead.dead")),
])
def test_resolve(topic, defaults, tc, cc, expected):
    got = resolve(topic, defaults, tc, cc, ".dead")
    assert got == expected


@pytest.mark.parametrize("body, parsed", [
    (b"", {}),
    (b"{}", {}),
    (b'{"max_attempts": 5}', {"max_attempts": 5}),
    (b'{"max_attempts": 65535, "message_ttl_ms": 0}', {"max_attempts": 65535, "message_ttl_ms": 0}),
    (b'{"overflow": "drop_oldest", "max_bytes": 1048576}', {"overflow": "drop_oldest", "max_bytes": 1048576}),
    (b'{"dead_letter_topic": "dlq"}', {"dead_letter_topic": "dlq"}),
    (b'{"dead_letter_topic": ""}', {"dead_letter_topic": ""}),
    (b'{"max_depth": null, "overflow": null}', {"max_depth": None, "overflow": None}),
])
def test_parse_config(body, parsed):
    assert parse_config(body, is_valid_name) == parsed


@pytest.mark.parametrize("body, code", [
    (b"{", "INVALID_BODY"),
    (b"\xff", "INVALID_BODY"),
    (b"[]", "INVALID_BODY"),
    (b'"max_attempts"', "INVALID_BODY"),
    (b'{"max_attempt": 1}', "INVALID_FIELD"),
    (b'{"max_attempts": -1}', "INVALID_VALUE"),
    (b'{"max_attempts": 65536}', "INVALID_VALUE"),
    (b'{"max_attempts": 1.5}', "INVALID_VALUE"),
    (b'{"max_attempts": "3"}', "INVALID_VALUE"),
    (b'{"max_attempts": true}', "INVALID_VALUE"),
    (b'{"message_ttl_ms": -5}', "INVALID_VALUE"),
    (b'{"max_depth": []}', "INVALID_VALUE"),
    (b'{"overflow": "BLOCK"}', "INVALID_VALUE"),
    (b'{"overflow": "spill"}', "INVALID_VALUE"),
    (b'{"dead_letter_topic": "no spaces"}', "INVALID_VALUE"),
    (b'{"dead_letter_topic": 5}', "INVALID_VALUE"),
])
def test_parse_config_refuses(body, code):
    with pytest.raises(PolicyError) as e:
        parse_config(body, is_valid_name)
    assert e.value.code == code


def test_merge():
    assert merge(None, {"max_attempts": 3}) == {"max_attempts": 3}
    assert merge({"max_attempts": 3, "max_depth": 2}, {"max_attempts": None, "overflow": "reject"}) == \
        {"max_depth": 2, "overflow": "reject"}
    assert merge({"max_attempts": 3}, {"max_depth": None}) == {"max_attempts": 3}


# ---- the policy file -----------------------------------------------------------------------------------------
def _book(path, **flags):
    return PolicyBook(str(path), SimpleNamespace(**flags))


def test_book_update_describe_and_file(tmp_path):
    book = _book(tmp_path, max_attempts=4)
    assert book.load().effective("t", "c") == Policy(max_attempts=4, dead_letter_topic="t.dead")
    out = book.update("t", None, b'{"message_ttl_ms": 2000}', is_valid_name)
    assert out["config"] == {"message_ttl_ms": 2000}
    assert out["effective"] == Policy(max_attempts=4, dead_letter_topic="t.dead", message_ttl_ms=2000).to_json()
    out = book.update("t", "c", b'{"max_attempts": 9, "overflow": "reject"}', is_valid_name)
    assert out["config"] == {"max_attempts": 9, "overflow": "reject"}
    assert out["topic_config"] == {"message_ttl_ms": 2000}
    assert out["effective"]["max_attempts"] == 9 and out["effective"]["message_ttl_ms"] == 2000
    doc = json.loads((tmp_path / FILE_NAME).read_text())
    assert doc == {"version": 1, "topics": {"t": {"message_ttl_ms": 2000}},
                   "channels": {"t": {"c": {"max_attempts": 9, "overflow": "reject"}}}}
    # null removes a field; a config left empty leaves the file
    book.update("t", "c", b'{"max_attempts": null, "overflow": null}', is_valid_name)
    book.update("t", None, b'{"message_ttl_ms": null}', is_valid_name)
    assert json.loads((tmp_path / FILE_NAME).read_text()) == {"version": 1, "topics": {}, "channels": {}}
    assert book.effective("t", "c") == Policy(max_attempts=4, dead_letter_topic="t.dead")
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]


def test_book_a_bad_body_changes_nothing(tmp_path):
    book = _book(tmp_path)
    book.update("t", None, b'{"max_depth": 5}', is_valid_name)
    with pytest.raises(PolicyError):
        book.update("t", None, b'{"max_depth": 6, "overflow": "nope"}', is_valid_name)
    assert _book(tmp_path).load().topic_config("t") == {"max_depth": 5}


def test_book_a_damaged_file_is_set_aside(tmp_path):
    (tmp_path / FILE_NAME).write_text('{"topics": {"t": {"max_attempts": "many"}}}')
    lines = []
    book = PolicyBook(str(tmp_path), SimpleNamespace(), SimpleNamespace(error=lines.append)).load()
    assert book.topics == {} and book.effective("t") == Policy.OFF
    assert (tmp_path / (FILE_NAME + ".bad")).exists() and not (tmp_path / FILE_NAME).exists()
    assert len(lines) == 1 and "cannot be read" in lines[0]


def test_book_an_unreadable_file_is_no_configs_and_updates_fail(tmp_path):
    (tmp_path / FILE_NAME).mkdir()   # open() fails (IsADirectoryError) as for an unreadable file
    lines = []
    book = PolicyBook(str(tmp_path), SimpleNamespace(max_attempts=2), SimpleNamespace(error=lines.append)).load()
    assert book.topics == {} and book.effective("t") == Policy(max_attempts=2, dead_letter_topic="t.dead")
    assert len(lines) == 1 and "cannot be read" in lines[0]
    with pytest.raises(OSError):
        book.update("t", None, b'{"max_depth": 1}', is_valid_name)


def _writer(path, who, n, barrier):
    barrier.wait()
    book = _book(path)
    for i in range(n):
        book.update(f"p{who}", f"c{i}", json.dumps({"max_depth": i + 1}).encode(), is_valid_name)
        book.update(f"p{who}", None, json.dumps({"max_attempts": i + 1}).encode(), is_valid_name)


def test_book_concurrent_writers_lose_nothing(tmp_path):
    """Forked processes (the HTTP API's gunicorn workers), each with threads (gthread), update at once: every
    update is in the file (the record lock serialises processes, the thread lock threads)."""
    procs, n, threads = 3, 15, 2
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(procs)

    def run(who):
        inner = threading.Barrier(threads)
        ts = [threading.Thread(target=_writer, args=(tmp_path, who * threads + k, n, inner)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    def child(who):
        barrier.wait()
        run(who)

    ps = [ctx.Process(target=child, args=(w,)) for w in range(procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
        assert p.exitcode == 0
    book = _book(tmp_path).load()
    writers = procs * threads
    assert book.topics == {f"p{w}": {"max_attempts": n} for w in range(writers)}
    assert book.channels == {f"p{w}": {f"c{i}": {"max_depth": i + 1} for i in range(n)} for w in range(writers)}


# ---- the owner: TopicTable with a PolicyBook (fakes of the topic and its host, tests/workers/worker_fakes.py) ----
class PolicyChannel(TableChannel):
    policy = Policy.OFF


class PolicyTopic(TableTopic):
    """A TableTopic whose channels get their policy as Topic.get_channel gives it, and that counts the
    policy_changed hook's calls."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.hooked = 0

    def get_channel(self, name):
        ch = self.channels.get(name)
        if ch is None:
            ch = PolicyChannel(self, name, self.log.open_channel(), self.host.next_channel_key())
            ch.policy = self.host.table.channel_policy(self.name, name)
            self.channels[name] = ch
            self.host.channels_by_key[ch.key] = ch
        return ch

    def policy_changed(self):
        self.hooked += 1


def _table(tmp_path, **flags):
    host, log = TableHost(), FakeLog()
    book = _book(tmp_path, **flags).load()
    opts = SimpleNamespace(max_channel_consumers=0)
    table = TopicTable(host, 0, 2, opts, RecordingJournal(), RecordingStats(), lambda: None, FailureReports(), log,
                       topic_class=PolicyTopic, channel_class=PolicyChannel, policies=book)
    host.table = table
    return table, log


def test_the_owner_gives_channels_their_policy_and_changes_it_on_command(tmp_path):
    ours = topic_owned_by(0)
    table, log = _table(tmp_path, max_attempts=2)
    writer = _book(tmp_path)   # the HTTP API's book: the same file
    ch = table.get_topic(ours).get_channel("c")
    assert ch.policy == Policy(max_attempts=2, dead_letter_topic=f"{ours}.dead")
    writer.update(ours, "c", b'{"max_depth": 3}', is_valid_name)
    assert ch.policy.max_depth == 0                    # not before the owner is told
    assert table.control_command(CMD.OP_CODES["policy_changed"], ours) == CMD.OK
    assert ch.policy == Policy(max_attempts=2, dead_letter_topic=f"{ours}.dead", max_depth=3)
    assert table.topics[ours].hooked == 1
    assert any(f"CHANNEL({ours}:c): policy max_attempts=2" in msg for _, msg in log.lines)
    # unchanged: no hook, no line
    lines = len(log.lines)
    assert table.control_command(CMD.OP_CODES["policy_changed"], ours) == CMD.OK
    assert table.topics[ours].hooked == 1 and len(log.lines) == lines
    # a new channel gets the file's config at once (read at the command)
    writer.update(ours, "d", b'{"overflow": "reject"}', is_valid_name)
    table.control_command(CMD.OP_CODES["policy_changed"], ours)
    assert table.get_topic(ours).get_channel("d").policy.overflow == "reject"


def test_policy_changed_for_a_topic_not_made_yet_or_owned_elsewhere(tmp_path):
    table, _ = _table(tmp_path)
    ours, theirs = topic_owned_by(0, stem="u"), topic_owned_by(1)
    _book(tmp_path).update(ours, None, b'{"message_ttl_ms": 9}', is_valid_name)
    assert table.control_command(CMD.OP_CODES["policy_changed"], ours) == CMD.OK
    assert ours not in table.topics                    # not created by it
    assert table.get_topic(ours).get_channel("c").policy == Policy(message_ttl_ms=9)
    assert table.control_command(CMD.OP_CODES["policy_changed"], theirs) == CMD.NOT_OWNER


def test_recovered_channels_get_their_policy(tmp_path):
    ours = topic_owned_by(0)
    _book(tmp_path).update(ours, "c", b'{"max_bytes": 77}', is_valid_name)
    table, _ = _table(tmp_path)
    table.recover({"topic_seq": 1, "channel_seq": 2, "topics": [{"name": ours, "index": 0, "paused": False,
                                                                  "channels": [{"name": "c", "ch": 0, "key": 1,
                                                                                "paused": False},
                                                                               {"name": "e", "ch": 1, "key": 2,
                                                                                "paused": False}]}]})
    t = table.topics[ours]
    assert t.channels["c"].policy == Policy(max_bytes=77) and t.channels["e"].policy is Policy.OFF
    assert t.hooked == 1


def test_without_a_book_every_channel_is_off(tmp_path):
    table = TopicTable(TableHost(), 0, 2, SimpleNamespace(max_channel_consumers=0), RecordingJournal(),
                       RecordingStats(), lambda: None, FailureReports(), FakeLog())
    assert table.channel_policy("t", "c") is Policy.OFF
