"""``nsqd.dat``: NSQ's metadata file (topics, their channels, paused flags), one per nsqd, in Go nsqd's JSON.

    {"topics": [{"channels": [{"name": "c", "paused": false}], "name": "t", "paused": false}], "version": "1.3.0"}

Ephemeral topics and channels are left out (as NSQ). Written through ``nsqd.dat.tmp`` (fsync, rename, fsync of the
directory), so a reader finds the old or the new file, never a torn one. nsqpy's workers keep their own journals
while running (``workers/storage/topic_journal.py``, fast and crash-safe); the supervisor writes this file from them whenever they
change and at exit, and every start reads it (``load``), so Go nsqd and nsqpy can take over each other's data path.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

FILE = "nsqd.dat"


@dataclass
class ChannelMeta:
    name: str
    paused: bool = False


@dataclass
class TopicMeta:
    name: str
    paused: bool = False
    channels: list = field(default_factory=list)


def path(data_path: str) -> str:
    return os.path.join(data_path, FILE)


def _ephemeral(name: str) -> bool:
    return name.endswith("#ephemeral")


def dumps(topics, version: str) -> bytes:
    doc = {"topics": [{"channels": [{"name": c.name, "paused": c.paused} for c in t.channels
                                    if not _ephemeral(c.name)],
                       "name": t.name, "paused": t.paused}
                      for t in topics if not _ephemeral(t.name)],
           "version": version}
    return json.dumps(doc, separators=(",", ":")).encode()


def save(data_path: str, topics, version: str) -> None:
    """Write ``topics`` (TopicMeta) atomically."""
    target = path(data_path)
    tmp = target + ".tmp"
    with open(tmp, "wb") as f:
        f.write(dumps(topics, version))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    fd = os.open(data_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(data_path: str) -> list:
    """The topics of ``nsqd.dat`` (empty when there is none). A file that is not NSQ's JSON raises ValueError:
    nsqd must not start and silently forget every topic (Go nsqd refuses too)."""
    try:
        with open(path(data_path), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    try:
        doc = json.loads(raw)
        topics = []
        for t in doc.get("topics") or []:
            chans = [ChannelMeta(str(c["name"]), bool(c.get("paused", False))) for c in t.get("channels") or []]
            topics.append(TopicMeta(str(t["name"]), bool(t.get("paused", False)), chans))
        return topics
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"failed to parse metadata {path(data_path)}: {e}") from None
