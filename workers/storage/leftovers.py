"""Shared memory that dead nsqd instances left in /dev/shm, for the operator: which instance, how much, and the data
path whose next start recovers it (``nsqd --leftovers``), and removal on purpose (``nsqd --discard-leftovers``).

An instance's segments are named by a hash of its data path and node id (``nsqpy.ipc.shm.instance_prefix``), which
cannot be turned back into the path. So each broker writes its data path and node id to
``/dev/shm/nsqpy-where-<hash>`` when it creates its segments (a few bytes; not a segment: the segment scans do not
match the name), and removes it with them. It lives and dies with the segments: a reboot clears both.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from nsqpy.ipc.layout import LayoutError
from nsqpy.ipc.shm import SHM_DIR, Scan, Segment, find_dead_instances, live_creators, list_segments, remove_segments
from nsqpy.workers.publishing import links


def _tag(prefix: str) -> str:
    """'/nsqpy-03afff1821-' -> 'nsqpy-03afff1821' (the name operators see and type)."""
    return prefix.strip("/-")


def _where_path(prefix: str) -> str:
    name, _, digest = _tag(prefix).rpartition("-")
    return os.path.join(SHM_DIR, f"{name}-where-{digest}")


def record(prefix: str, data_path: str, node_id: int) -> None:
    """Say which data path and node id the segments of ``prefix`` belong to (the supervisor, at creation)."""
    tmp = _where_path(prefix) + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.path.realpath(data_path)}\n{node_id}\n")
    os.replace(tmp, _where_path(prefix))


def forget(prefix: str) -> None:
    try:
        os.unlink(_where_path(prefix))
    except FileNotFoundError:
        pass


def _recorded(prefix: str) -> tuple[str, int] | tuple[None, None]:
    try:
        with open(_where_path(prefix)) as f:
            path, node_id = f.read().splitlines()[:2]
        return path, int(node_id)
    except (OSError, ValueError):
        return None, None


def holds_messages(name: str) -> bool:
    """A segment that may hold messages, worth recovering: a topic log or deferred entries, or the links segment
    when one of its pub rings holds an unreleased record (a message acknowledged and not yet at its owner)."""
    kind = name.rsplit("-", 2)[-2]
    if kind == "links":
        return _links_hold_records(name)
    return kind in ("topic", "log") or kind.startswith("defer")


def _links_hold_records(name: str) -> bool:
    try:
        seg = Segment.attach(name)
    except OSError:  # gone meanwhile
        return False
    except LayoutError:  # not a segment this code can read: keep it
        return True
    try:
        return links.holds_records(seg.buf)
    finally:
        seg.close()


def _blocks(name: str) -> int:
    try:
        return os.stat(os.path.join(SHM_DIR, name.lstrip("/"))).st_blocks * 512
    except OSError:
        return 0


@dataclass
class Leftover:
    prefix: str           # '/nsqpy-<hash>-'
    names: list[str]
    nbytes: int           # /dev/shm blocks they hold
    messages: bool        # some of them may hold messages
    data_path: str | None  # None: not recorded (an nsqd from before the record, or its file is gone)
    node_id: int | None

    @property
    def tag(self) -> str:
        return _tag(self.prefix)

    def line(self) -> str:
        held = "may hold messages" if self.messages else "no messages"
        where = (f"recovered by: nsqd --data-path={self.data_path} --node-id={self.node_id}" if self.data_path
                 else "data path not recorded")
        return f"{self.tag}  {len(self.names)} segments  {self.nbytes / (1 << 20):.1f} MiB  {held}  {where}"


def find(instances=None) -> list[Leftover]:
    """Every dead instance's leftovers (``instances``: ``find_dead_instances()``'s answer, if already at hand)."""
    found = []
    scan = Scan()  # each segment's header and each creator's /proc entry read once in this decision
    for prefix, names in (find_dead_instances(scan=scan) if instances is None else instances).items():
        names = list_segments(prefix)  # all of them, also those of its processes still dying
        if live_creators(names, scan):
            continue
        path, node_id = _recorded(prefix)
        found.append(Leftover(prefix, names, sum(map(_blocks, names)), any(map(holds_messages, names)), path,
                              node_id))
    return found


def summary(leftovers: list[Leftover], removed: list[Leftover] = ()) -> str | None:
    """The one start-up line about them, or None."""
    if not leftovers and not removed:
        return None
    parts = []
    if leftovers:
        mib = sum(x.nbytes for x in leftovers) / (1 << 20)
        parts.append(f"{_instances(len(leftovers))} left {mib:.1f} MiB of shared memory that may hold messages "
                     f"(their next start recovers them; `nsqd --leftovers` lists them)")
    if removed:
        mib = sum(x.nbytes for x in removed) / (1 << 20)
        parts.append(f"removed {mib:.1f} MiB of shared memory of {_instances(len(removed))} that held no messages")
    return "; ".join(parts)


def _instances(n: int) -> str:
    return f"{n} dead nsqd instance{'' if n == 1 else 's'}"


def remove(leftover: Leftover) -> tuple[int, int]:
    """Unlink its segments and its record; -> (segments removed, bytes)."""
    done = remove_segments(leftover.names)
    forget(leftover.prefix)
    return done


def discard(tag: str) -> tuple[int, str]:
    """``nsqd --discard-leftovers=TAG``: -> (exit code, the one line to print)."""
    tag = _tag(tag.rsplit("/", 1)[-1])
    matches = [x for x in find() if x.tag == tag]
    if not matches:
        alive = list_segments(f"/{tag}-")
        if alive:
            return 1, f"{tag} belongs to a running nsqd (or one still starting): stop it instead"
        return 1, f"no leftover shared memory named {tag} (`nsqd --leftovers` lists them)"
    count, nbytes = remove(matches[0])
    lost = "; the messages it held are lost" if matches[0].messages else ""
    return 0, f"discarded {tag}: {count} segments, {nbytes / (1 << 20):.1f} MiB{lost}"


def report() -> tuple[int, str]:
    """``nsqd --leftovers``: -> (exit code, the lines to print)."""
    found = find()
    if not found:
        return 0, "no shared memory of dead nsqd instances"
    return 0, "\n".join(x.line() for x in found)
