"""Sans-IO codec for NSQ's V2 (nsqd) and V1 (nsqlookupd) TCP protocols: bytes in, commands out, bytes back.

Modules, by noun: `errors` (wire error codes), `frames` (server frames), `ids` (message IDs), `commands`
(what a V2 client sends), `names` (topic/channel names, numbers), `states` (client state table),
`v2_parser` + `v2_bodies` (server-role parser), `identify` (IDENTIFY negotiation), `client` (client role),
`v1` (lookupd, both roles), `kernels` (the numba kernels behind the batch paths), `gojson` (Go-style JSON).

Importing this package compiles nothing: numba kernels compile (or load from cache) on first use.
"""

from nsqpy.protocol.commands import (
    Auth, Cls, Command, Dpub, Fin, FinBatch, Identify, Mpub, Nop, Pub, Rdy, Req, Sub, Touch)
from nsqpy.protocol.errors import DropConnection, ProtocolError
from nsqpy.protocol.identify import ClientSettings, ServerSettings, negotiate_identify
from nsqpy.protocol.v2_parser import Limits, V2Parser, iter_commands

__all__ = [
    "Auth", "Cls", "Command", "Dpub", "Fin", "FinBatch", "Identify", "Mpub", "Nop", "Pub", "Rdy", "Req", "Sub",
    "Touch", "DropConnection", "ProtocolError", "ClientSettings", "ServerSettings", "negotiate_identify",
    "Limits", "V2Parser", "iter_commands",
]
