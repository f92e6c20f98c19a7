"""What every daemon shares: the enums NSQ reports as numbers, and the common flags.

The enums are IntEnums because NSQ stores these options as Go integers and
``GET /config/:opt`` answers with the number (log_level 2 means info,
tls_min_version 769 means TLS 1.0), while nsqpy code can still say
``LogLevel.INFO`` or ``TLSVersion.TLS1_2``.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import socket
import zlib

from .kinds import Bool, Choice, Str
from .options import Options, option
from .support import Deprecated


class LogLevel(enum.IntEnum):
    """internal/lg levels; NSQ accepts the lower-case names (any case), and not "warning"."""

    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4
    FATAL = 5


class TLSRequired(enum.IntEnum):
    """nsqd's TLSNotRequired / TLSRequiredExceptHTTP / TLSRequired."""

    NOT_REQUIRED = 0
    EXCEPT_HTTP = 1  # "tcp-https": TLS on the TCP protocol, plain HTTP still served
    REQUIRED = 2


class TLSVersion(enum.IntEnum):
    """crypto/tls version numbers, as nsqd stores --tls-min-version."""

    TLS1_0 = 0x0301
    TLS1_1 = 0x0302
    TLS1_2 = 0x0303
    TLS1_3 = 0x0304


LOG_LEVEL = Choice(
    {level.name.lower(): level for level in LogLevel},
    "invalid log level '{text}' (debug, info, warn, error, fatal)",
)


def hostname() -> str:
    """The OS hostname (Go's os.Hostname), the default broadcast address."""
    return socket.gethostname()


def default_node_id(host: str | None = None) -> int:
    """nsqd's default --node-id: crc32 (IEEE) of the md5 digest of the hostname, mod 1024."""
    digest = hashlib.md5((hostname() if host is None else host).encode()).digest()
    return zlib.crc32(digest) % 1024


@dataclasses.dataclass
class DaemonOptions(Options):
    """Flags every NSQ daemon has; subclasses override log_prefix's default."""

    config: str = option(Str(), "", "path to a TOML config file; its keys are the option names "
                         "with _ for -, and command-line flags override it", from_file=False, reported=False)
    version: bool = option(Bool(), False, "print the version and exit", from_file=False, reported=False)
    log_level: LogLevel = option(LOG_LEVEL, LogLevel.INFO, "log verbosity: debug, info, warn, error or fatal")
    log_prefix: str = option(Str(), "", "prefix for every log line")
    verbose: bool = option(Bool(), False, "[deprecated] no effect; use --log-level",
                           support=Deprecated("--log-level"))
