"""Sans-IO codec for NSQ's V2 (nsqd) and V1 (nsqlookupd) TCP protocols: bytes in, commands out, bytes back.

Modules, by noun: `errors` (wire error codes), `frames` (server frames), `ids` (message IDs), `commands`
(what a V2 client sends), `names` (topic/channel names, numbers), `states` (client state table),
`v2_parser` + `v2_bodies` (server-role parser), `identify` (IDENTIFY negotiation), `limits` (nsqd's limits: one
object for the parser, IDENTIFY and the broker), `client` (client role), `v1` (lookupd, both roles), `kernels` (the
numba kernels behind the batch paths), `v2_recognisers` (compiled checks that one read is exactly one plain PUB or
MPUB: the broker's fast path), `gojson` (Go-style JSON).

Importing this package compiles nothing: numba kernels compile (or load from cache) on first use.
"""

# Names resolve on first use (PEP 562), so `import nsqpy.protocol.client` or `.errors` does not pull in the parser
# and its numba kernels: the client library (nsqpy.client) must import without numba.
_EXPORTS = {
    "nsqpy.protocol.commands": (
        "Auth", "Cls", "Command", "Dpub", "Fin", "FinBatch", "Identify", "Mpub", "Nop", "Pub", "Rdy", "Req", "Sub",
        "Touch"),
    "nsqpy.protocol.errors": ("DropConnection", "ProtocolError"),
    "nsqpy.protocol.identify": ("ClientSettings", "ServerSettings", "negotiate_identify"),
    "nsqpy.protocol.limits": ("Limits",),
    "nsqpy.protocol.v2_parser": ("V2Parser", "iter_commands"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [name for names in _EXPORTS.values() for name in names]


def __getattr__(name: str):
    import importlib
    module = _WHERE.get(name)
    if module is None:  # `nsqpy.protocol.v2_parser` after a bare `import nsqpy.protocol`, as before the lazy names
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value
