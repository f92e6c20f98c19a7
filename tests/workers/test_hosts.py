"""The declared hosts of Channel, Topic and Session (workers/domain/hosts.py) against what really provides them and
what really uses them, without starting a broker.

Three directions, so the interface cannot drift either way:
* the real ``Worker`` class (and the real classes of the parts a Protocol names: pump, loop, suspect words, topic
  journal, control block, stats publisher, options, logger) provides every member: a method or class attribute,
  or an attribute some method of a class in its MRO assigns (``self.x = ...``), read from the source with ``ast``;
* each domain class uses of its host exactly what its Protocol names (its ``self.worker.x`` reads, found by
  ``ast`` in its module, and for Session in its AUTH mixin and the TLS/compression upgrade too);
* the unit tests' fakes (tests/workers/fakes.py) implement the Protocols they stand in for.
"""
import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from nsqpy.workers.domain import hosts as H

WORKERS = Path(H.__file__).resolve().parents[1]
_PROTOCOL_BASES = {"Protocol", "Generic", "object"}


def members(proto):
    """Names a Protocol declares (annotations and methods, its Protocol bases' included)."""
    names = set()
    for cls in proto.__mro__:
        if cls.__name__ in _PROTOCOL_BASES:
            continue
        names |= set(cls.__dict__.get("__annotations__", {}))
        names |= {k for k, v in cls.__dict__.items() if callable(v) and not (k.startswith("__") and k.endswith("__"))}
    return names


def _assigned_in(cls):
    """Attributes the methods of cls assign on self (``self.x = ``, ``self.x, self.y = ``, ``self.x += ``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            out.add(node.attr)
    return out


def provided(cls):
    """What instances of cls have, as far as the class and its methods' source say."""
    names = set(dir(cls))
    for klass in cls.__mro__:
        names |= _assigned_in(klass)
    return names


def host_reads(path, receivers=("self.worker",), aliases_of="self.worker"):
    """Attribute names read on a host in the module at path: ``self.worker.x``, and ``w.x`` for every name bound
    by ``w = self.worker`` (or ``worker = session.worker``: pass it in ``receivers``)."""
    tree = ast.parse(Path(path).read_text())
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                ast.unparse(node.value) in (aliases_of,) + tuple(receivers):
            aliases.add(node.targets[0].id)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = ast.unparse(node.value)
            if base in receivers or base in aliases:
                names.add(node.attr)
    return names


def _worker_class():
    from nsqpy.workers.processes.worker import Worker
    return Worker


# ---- the real providers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("proto", [H.ChannelHost, H.TopicHost, H.SessionHost], ids=lambda p: p.__name__)
def test_the_real_worker_provides_every_member_its_hosts_name(proto):
    missing = members(proto) - provided(_worker_class())
    assert not missing, f"Worker lacks what {proto.__name__} names: {sorted(missing)}"


def _parts():
    from nsqpy.config import NsqdOptions
    from nsqpy.log import Logger
    from nsqpy.workers.control.block import Control
    from nsqpy.workers.domain.stats_rows import StatsPublisher
    from nsqpy.workers.processes.event_loop import Loop
    from nsqpy.workers.storage.poison import Suspect
    from nsqpy.workers.storage.topic_journal import Directory
    return [(H.SuspectWords, Suspect), (H.ChannelJournal, Directory), (H.TopicJournal, Directory),
            (H.TopicFullMarks, Control), (H.TopicStats, StatsPublisher), (H.SessionLoop, Loop), (H.Log, Logger)]


@pytest.mark.parametrize("i", range(7))
def test_the_real_parts_provide_what_their_protocols_name(i):
    proto, cls = _parts()[i]
    missing = members(proto) - provided(cls)
    assert not missing, f"{cls.__name__} lacks what {proto.__name__} names: {sorted(missing)}"


def test_the_real_pump_and_options_provide_what_their_protocols_name():
    """The pump's per-fd arrays and the options are made at run time (setattr, dataclass fields): instances."""
    from nsqpy.config import NsqdOptions
    from nsqpy.workers.lane.pump import Pump
    opts = NsqdOptions()
    assert not {m for m in members(H.TopicOptions) if not hasattr(opts, m)}
    pump = Pump(1024)
    try:
        assert not {m for m in members(H.SessionPump) if not hasattr(pump, m)}
    finally:
        pump.ep.close()


# ---- the real users ----------------------------------------------------------------------------------------
SELF_OR_ARG = ("self.worker", "worker")  # the constructor reads its argument before it is self.worker


def test_a_channel_uses_exactly_what_channel_host_names():
    assert host_reads(WORKERS / "domain" / "channel.py") == members(H.ChannelHost)


def test_a_topic_uses_what_topic_host_adds_and_nothing_it_does_not_name():
    used = host_reads(WORKERS / "domain" / "topic.py", receivers=SELF_OR_ARG)
    assert used <= members(H.TopicHost)
    assert members(H.TopicHost) - members(H.ChannelHost) <= used | {"directory", "opts"}  # (narrowed types)


def test_a_session_uses_exactly_what_session_host_names():
    used = host_reads(WORKERS / "domain" / "session.py", receivers=SELF_OR_ARG) | \
        host_reads(WORKERS / "connections" / "auth.py") | \
        host_reads(WORKERS / "connections" / "auth.py", receivers=("worker",)) | \
        host_reads(WORKERS / "connections" / "transport.py", receivers=("worker",), aliases_of="session.worker")
    assert used == members(H.SessionHost)


def test_the_channel_parent_protocol_is_what_a_channel_uses_of_its_topic():
    used = host_reads(WORKERS / "domain" / "channel.py", receivers=("self.topic", "topic"), aliases_of="self.topic")
    assert used == members(H.ChannelParent)


# ---- the fakes ---------------------------------------------------------------------------------------------
def test_the_fakes_implement_the_protocols_they_stand_in_for():
    from tests.workers import fakes
    for proto, fake in ((H.ChannelHost, fakes.FakeWorker), (H.TopicHost, fakes.FakeTopicHost),
                        (H.SessionHost, fakes.FakeSessionHost), (H.ChannelParent, fakes.FakeTopic)):
        missing = members(proto) - provided(fake)
        assert not missing, f"{fake.__name__} lacks what {proto.__name__} names: {sorted(missing)}"
