"""NsqlookupdOptions: the nsqlookupd flags of NSQ v1.3.0, with its defaults."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from .common import DaemonOptions, hostname
from .duration import MINUTE, SECOND
from .kinds import Duration, Int, Str
from .options import option


@dataclasses.dataclass
class NsqlookupdOptions(DaemonOptions):
    PROG: ClassVar[str] = "nsqlookupd"

    log_prefix: str = option(Str(), "[nsqlookupd] ", "prefix for every log line")
    tcp_address: str = option(Str(), "0.0.0.0:4160", "<addr>:<port> for TCP clients (nsqd)")
    http_address: str = option(Str(), "0.0.0.0:4161", "<addr>:<port> for HTTP clients")
    broadcast_address: str = option(Str(), None, "address of this nsqlookupd node (default: the OS hostname)",
                                     factory=hostname)
    inactive_producer_timeout: int = option(Duration(), 5 * MINUTE, "time since its last ping after which an "
                                            "nsqd is no longer listed")
    tombstone_lifetime: int = option(Duration(), 45 * SECOND, "time a tombstoned producer stays hidden")

    # nsqpy's own options: not in NSQ; each help says so.
    http_workers: int = option(Int(1, 64), 2, "nsqpy only: gunicorn worker processes serving the HTTP API (they "
                               "all read the one registration database of the registry process); asgi workers, "
                               "as nsqd's default: clients that send requests slowly hold no worker, and a "
                               "request's headers must arrive within 10 s", nsqpy_only=True)
