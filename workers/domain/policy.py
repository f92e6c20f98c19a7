"""Per-topic and per-channel delivery policies nsqpy adds to NSQ (opt-in, all off by default): server-side max
attempts with a dead-letter topic, a message TTL, and bounded channels with an overflow policy.

Theory of operation: a ``Policy`` is the *effective* set of values for one channel (or for a topic's own queue):
nsqd's flags give the defaults (``flag_defaults``), a topic's config overrides them, a channel's config overrides
its topic's (``resolve``). A config is a dict holding only the fields that were set (``parse_config`` reads
``POST /topic/config`` and ``POST /channel/config`` bodies; JSON ``null`` for a field removes it, so the value
falls back again). The owner worker of a topic holds the ``Policy`` of each of its channels in ``Channel.policy``
(``Policy.OFF`` unless one is configured) and re-resolves it when a config changes; every part of the broker that
acts on a policy reads that attribute and nothing else.

Dead letters: ``dead_letter_topic`` is the effective name, "" when dead-lettering is not configured. It is set
explicitly by a config, or implied by ``max_attempts`` > 0 as the topic's name + ``--dead-letter-topic-suffix``
(default ``.dead``). A message that reaches ``max_attempts`` deliveries and is then REQ'd or times out goes there;
a message older than ``message_ttl_ms`` goes there when a dead-letter topic is in effect, otherwise it is
dropped (and counted). The flags' defaults do not apply to a topic whose name ends with the suffix (a dead-letter
topic does not dead-letter again unless configured to explicitly).
"""
from __future__ import annotations

import dataclasses
import json

OVERFLOWS = ("block", "reject", "drop_oldest")
DEFAULT_SUFFIX = ".dead"
FIELDS = ("max_attempts", "dead_letter_topic", "message_ttl_ms", "max_depth", "max_bytes", "overflow")
_INTS = ("max_attempts", "message_ttl_ms", "max_depth", "max_bytes")
MAX_ATTEMPTS = 65535   # a message's attempts field is 16 bits on the wire


class PolicyError(ValueError):
    """A config body that cannot be applied; ``code`` is the HTTP API's error text (NSQ style: ``INVALID_...``)."""

    def __init__(self, code, detail=""):
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class Policy:
    max_attempts: int = 0          # 0 = off; else dead-letter once a message was delivered this many times
    dead_letter_topic: str = ""    # "" = no dead-letter topic in effect
    message_ttl_ms: int = 0        # 0 = off
    max_depth: int = 0             # 0 = off; messages waiting (depth) per channel
    max_bytes: int = 0             # 0 = off; bytes of the messages waiting per channel (memory and disk)
    overflow: str = "block"        # what a publish to a channel at max_depth/max_bytes does

    OFF = None  # set below: the policy of everything nobody configured

    @property
    def message_ttl_ns(self):
        return self.message_ttl_ms * 1_000_000

    @property
    def bounded(self):
        """A depth or byte bound: checked at publish (workers/domain/bounds.py), so the lane's own path, which
        appends in compiled code, does not arm the topic; a TTL is checked in the compiled round itself."""
        return self.max_depth > 0 or self.max_bytes > 0

    def to_json(self):
        return dataclasses.asdict(self)


Policy.OFF = Policy()


def flag_defaults(opts):
    """The policy fields nsqd's flags set (``--max-attempts`` ...) as a config dict (only fields that are on)."""
    values = {
        "max_attempts": getattr(opts, "max_attempts", 0) or 0,
        # a Duration flag is ns; whole ms, truncated as Go's d / time.Millisecond
        "message_ttl_ms": (getattr(opts, "message_ttl", 0) or 0) // 1_000_000,
        "max_depth": getattr(opts, "max_channel_depth", 0) or 0,
        "max_bytes": getattr(opts, "max_channel_bytes", 0) or 0,
    }
    out = {name: int(value) for name, value in values.items() if value}
    overflow = getattr(opts, "channel_overflow", "block") or "block"
    if overflow != "block":
        out["overflow"] = overflow
    return out


def suffix_of(opts):
    return getattr(opts, "dead_letter_topic_suffix", DEFAULT_SUFFIX) or DEFAULT_SUFFIX


def resolve(topic, defaults, topic_config=None, channel_config=None, suffix=DEFAULT_SUFFIX):
    """The effective Policy of a channel of ``topic`` (or of the topic's own queue with channel_config None):
    ``defaults`` (flag_defaults) < topic_config < channel_config."""
    values = {} if topic.endswith(suffix) else dict(defaults)
    values.update(topic_config or {})
    values.update(channel_config or {})
    if not values:
        return Policy.OFF
    dead = values.get("dead_letter_topic", "")
    if not dead and values.get("max_attempts", 0) > 0:
        dead = topic + suffix
    values["dead_letter_topic"] = dead
    return Policy(**{k: values[k] for k in FIELDS if k in values})


def parse_config(body, valid_topic_name):
    """A POST body (bytes, a JSON object of FIELDS) -> {field: value or None}; None removes the field. Raises
    PolicyError for what cannot be applied (``valid_topic_name(name) -> bool`` checks dead_letter_topic)."""
    try:
        doc = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise PolicyError("INVALID_BODY", f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise PolicyError("INVALID_BODY", "must be a JSON object")
    out = {}
    for key, value in doc.items():
        if key not in FIELDS:
            raise PolicyError("INVALID_FIELD", f"unknown field {key!r} (fields: {', '.join(FIELDS)})")
        if value is None:
            out[key] = None
        elif key in _INTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PolicyError("INVALID_VALUE", f"{key} must be an integer >= 0")
            if key == "max_attempts" and value > MAX_ATTEMPTS:
                raise PolicyError("INVALID_VALUE", f"max_attempts must be at most {MAX_ATTEMPTS}")
            out[key] = value
        elif key == "overflow":
            if value not in OVERFLOWS:
                raise PolicyError("INVALID_VALUE", f"overflow must be one of {', '.join(OVERFLOWS)}")
            out[key] = value
        else:  # dead_letter_topic
            if not isinstance(value, str) or (value and not valid_topic_name(value)):
                raise PolicyError("INVALID_VALUE", "dead_letter_topic must be a valid topic name")
            out[key] = value
    return out


def merge(config, changes):
    """A stored config with a parse_config result applied (None removes a field)."""
    out = dict(config or {})
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out
