"""The dead letter's format (nsqpy only, issue 49): what a consumer of a dead-letter topic reads.

A channel with ``max_attempts`` or ``message_ttl_ms`` (``workers/domain/policy.py``) moves a message it gives up
on to its dead-letter topic as an ordinary new message of that topic (an ID of the dead-letter topic's own, so IDs
stay unique there even when several topics share one) whose body is one JSON header line, then ``\\n``, then the
original body, byte for byte::

    {"topic":"T","channel":"C","id":"<16 hex digits>","attempts":N,"timestamp":<publish ns>,"reason":"ttl"}\\n<body>

``reason`` is ``max_attempts`` (the message was delivered ``attempts`` times, then REQ'd, timed out or its
consumer went away with it in flight) or ``ttl`` (it was older than the channel's ``message_ttl_ms`` when it came
up for delivery; ``attempts`` is how often it had been delivered before). ``timestamp`` is the original publish
time in ns since the epoch (NSQ's message timestamp); ``id`` the original message ID as the 16 hex digits NSQ's
FIN/REQ use. ``decode`` reads one back; ``nsqpy.client`` re-exports it as ``decode_dead_letter``. Standard library
only: the client imports it.
"""
from __future__ import annotations

import json

MAX_ATTEMPTS = "max_attempts"
TTL = "ttl"
REASONS = (MAX_ATTEMPTS, TTL)
HEADER_FIELDS = ("topic", "channel", "id", "attempts", "timestamp", "reason")


def encode_header(topic, channel, msg_id, attempts, timestamp, reason):
    """The header line (with its ``\\n``) of a dead letter of message ``msg_id`` (the uint64 ID) of topic/channel."""
    return json.dumps({"topic": topic, "channel": channel, "id": f"{msg_id:016x}", "attempts": int(attempts),
                       "timestamp": int(timestamp), "reason": reason}, separators=(",", ":")).encode() + b"\n"


def encode(topic, channel, msg_id, attempts, timestamp, reason, body):
    return encode_header(topic, channel, msg_id, attempts, timestamp, reason) + bytes(body)


def decode(body):
    """A dead letter's body -> (header dict with HEADER_FIELDS, the original body). ValueError when it is not one."""
    raw = bytes(body)
    line, sep, rest = raw.partition(b"\n")
    if not sep:
        raise ValueError("not a dead letter: no header line")
    try:
        header = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not a dead letter: its header is not JSON ({e})") from None
    if not isinstance(header, dict) or any(k not in header for k in HEADER_FIELDS):
        raise ValueError(f"not a dead letter: its header lacks one of {', '.join(HEADER_FIELDS)}")
    return header, rest
