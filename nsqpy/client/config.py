"""Every client option in one typed object, with go-nsq's names and defaults (spec 7.2-7.5).

Durations are seconds (floats) here; the connection converts to the milliseconds IDENTIFY, REQ and DPUB take.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field, fields, replace

VERSION = "0.1.0"  # the one place of the version: setup.cfg reads it (attr:); no metadata lookup at import

__all__ = ["Config", "VERSION"]


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class Config:
    # IDENTIFY (spec 1.6); 0 means "the server's default" where NSQ says so.
    client_id: str = field(default_factory=_short_hostname)
    hostname: str = field(default_factory=socket.gethostname)
    user_agent: str = f"nsqpy/{VERSION}"
    heartbeat_interval: float = 30.0      # must stay below read_timeout: two missed heartbeats drop the link
    output_buffer_size: int = 16384
    output_buffer_timeout: float = 0.25
    msg_timeout: float = 0.0              # 0: the server's --msg-timeout
    sample_rate: int = 0
    tls_v1: bool = False
    tls_context: ssl.SSLContext | None = None   # None with tls_v1: ssl.create_default_context()
    tls_server_hostname: str | None = None      # None: the host dialled
    deflate: bool = False
    deflate_level: int = 6
    snappy: bool = False                  # needs cramjam (nsqpy.protocol.snappy_stream)
    auth_secret: str = ""

    # Connections.
    dial_timeout: float = 1.0
    read_timeout: float = 60.0            # no byte for this long: the connection is dead
    write_timeout: float = 1.0            # producer: a publish's reply (and the bootstrap) must come within this,
                                          # else the connection is dropped and the publish goes to the next nsqd
    max_reconnect_interval: float = 15.0  # producer: cap of the dial and fail-back back-off
    reconnect_interval: float = 15.0      # consumer: pynsq's 15 s before re-dialling a lost direct nsqd

    # Consumer flow control (spec 7.2).
    max_in_flight: int = 1
    rdy_redistribute_interval: float = 5.0
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    rdy_retry_interval: float = 5.0       # a RDY held back by the max_in_flight total is retried this often

    # Consumer failure handling (spec 7.3).
    max_attempts: int = 5                 # 0: never give up
    default_requeue_delay: float = 90.0   # x attempts
    max_requeue_delay: float = 900.0
    backoff_multiplier: float = 1.0
    max_backoff_duration: float = 120.0
    drain_timeout: float = 30.0           # graceful stop waits this long for handlers to answer in-flight messages

    # Discovery (spec 7.4).
    lookupd_poll_interval: float = 60.0
    lookupd_poll_jitter: float = 0.3
    lookupd_request_timeout: float = 2.0

    def replace(self, **changes) -> "Config":
        return replace(self, **changes)

    @classmethod
    def build(cls, config: "Config | None" = None, **options) -> "Config":
        """`config` (or the defaults) with `options` on top; an unknown option name is a TypeError."""
        base = config if config is not None else cls()
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise TypeError(f"unknown client option(s): {', '.join(sorted(unknown))}")
        return replace(base, **options) if options else base

    def identify_body(self) -> dict:
        body = {
            "client_id": self.client_id, "hostname": self.hostname, "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": _ms_or_off(self.heartbeat_interval),
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": _ms_or_off(self.output_buffer_timeout),
            "tls_v1": self.tls_v1, "snappy": self.snappy, "deflate": self.deflate,
            "deflate_level": self.deflate_level, "sample_rate": self.sample_rate,
        }
        if self.msg_timeout:
            body["msg_timeout"] = int(self.msg_timeout * 1000)
        return body


def _ms_or_off(seconds: float) -> int:
    return -1 if seconds < 0 else int(seconds * 1000)
