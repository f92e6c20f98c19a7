"""nsqlookupd's TCP protocol V1, both roles (spec 4.1).

Client -> lookupd: magic `"  V1"`, then lines (`PING`, `IDENTIFY` + int32 size + JSON, `REGISTER topic [channel]`,
`UNREGISTER topic [channel]`), trimmed of whitespace and split on spaces. Lookupd -> client: `[int32 size][data]`
with no frame type; errors travel the same way as `"<CODE> <desc>"` and every one is fatal.

`V1Parser.feed()` follows the V2 parser's contract: a list of commands whose last item may be the
`ProtocolError` that ends the connection (send `error_reply(err)`, or nothing for `DropConnection`). It tracks
whether the peer has identified, since REGISTER/UNREGISTER need that and any IDENTIFY failure is fatal.

Bounds: nsqlookupd reads lines and the IDENTIFY body without a limit; here a line may not exceed 16 KiB (the
V2 read buffer; nsqd's lines are short) and the IDENTIFY body `max_identify_body` (1 MiB by default, far above
the ~200 bytes nsqd sends). Beyond either the connection is dropped / gets E_BAD_BODY.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from nsqpy.protocol.errors import (
    BadBody, BadChannel, BadProtocol, BadTopic, DropConnection, Invalid, ProtocolError, raw_text)
from nsqpy.protocol.gojson import INT64, decode_struct
from nsqpy.protocol.names import is_valid_name

__all__ = [
    "MAGIC_V1", "Ping", "PeerInfo", "IdentifyV1", "Register", "Unregister", "V1Parser",
    "reply", "error_reply", "identify_response", "OK_REPLY",
    "magic", "ping", "identify", "register", "unregister", "ReplyDecoder", "is_error",
]

MAGIC_V1 = b"  V1"
MAX_LINE = 16384
_I32 = struct.Struct(">i")
# Go's unicode.IsSpace, which strings.TrimSpace uses (Python's str.strip would also take \x1c-\x1f).
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000"


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class PeerInfo:
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    hostname: str = ""
    topology_zone: str = ""
    topology_region: str = ""


@dataclass(frozen=True, slots=True)
class IdentifyV1:
    peer: PeerInfo
    body: bytes


@dataclass(frozen=True, slots=True)
class Register:
    topic: str
    channel: str | None = None


@dataclass(frozen=True, slots=True)
class Unregister:
    topic: str
    channel: str | None = None


_PEER_FIELDS = {
    "broadcast_address": (str, None, ""), "tcp_port": (int, INT64, 0), "http_port": (int, INT64, 0),
    "version": (str, None, ""), "hostname": (str, None, ""), "topology_zone": (str, None, ""),
    "topology_region": (str, None, ""), "remote_address": (str, None, ""),
}


def parse_peer_info(body: bytes) -> PeerInfo:
    fields = decode_struct(body, _PEER_FIELDS)
    if fields is None:
        raise BadBody("IDENTIFY failed to decode JSON body")
    if not fields["broadcast_address"] or not fields["tcp_port"] or not fields["http_port"] or not fields["version"]:
        raise BadBody("IDENTIFY missing fields")
    del fields["remote_address"]  # lookupd overwrites it with the connection's address
    return PeerInfo(**fields)


class V1Parser:
    """Server-role incremental V1 parser for one lookupd connection."""

    def __init__(self, *, expect_magic: bool = True, max_identify_body: int = 1 << 20):
        self.identified = False
        self.error: ProtocolError | None = None
        self.max_identify_body = max_identify_body
        self._need_magic = expect_magic
        self._buf = b""

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, chunk: bytes) -> list:
        if self.error is not None:
            raise RuntimeError("V1Parser refuses input after a fatal error")
        data = self._buf + bytes(chunk) if self._buf else bytes(chunk)
        out: list = []
        try:
            pos = self._parse(data, out)
        except ProtocolError as err:
            self.error = err.with_traceback(None)
            self._buf = b""
            out.append(err)
            return out
        self._buf = data[pos:]
        return out

    def _parse(self, data: bytes, out: list) -> int:
        pos = 0
        if self._need_magic:
            if len(data) < 4:
                return 0
            if data[:4] != MAGIC_V1:
                raise BadProtocol()
            self._need_magic = False
            pos = 4
        while True:
            nl = data.find(b"\n", pos, pos + MAX_LINE)
            if nl < 0:
                if len(data) - pos >= MAX_LINE:
                    raise DropConnection("line longer than 16 KiB")
                return pos
            params = raw_text(data[pos:nl]).strip(_GO_SPACE).split(" ")
            verb = params[0]
            if verb == "IDENTIFY":
                command, body_end = self._identify(data, nl + 1)
                if command is None:
                    return pos  # wait for the whole body, re-reading the line then
                out.append(command)
                pos = body_end
                continue
            pos = nl + 1
            if verb == "PING":
                out.append(Ping())
            elif verb in ("REGISTER", "UNREGISTER"):
                out.append(self._registration(verb, params[1:]))
            else:
                raise Invalid(f"invalid command {verb}")

    def _identify(self, data: bytes, pos: int):
        if self.identified:
            raise Invalid("cannot IDENTIFY again")
        if len(data) - pos < 4:
            return None, pos
        size = _I32.unpack_from(data, pos)[0]
        if size < 0 or size > self.max_identify_body:
            raise BadBody("IDENTIFY failed to read body")
        end = pos + 4 + size
        if len(data) < end:
            return None, pos
        body = data[pos + 4:end]
        peer = parse_peer_info(body)
        self.identified = True
        return IdentifyV1(peer, body), end

    def _registration(self, verb: str, params: list[str]):
        if not self.identified:
            raise Invalid("client must IDENTIFY")
        if not params:
            raise Invalid(f"{verb} insufficient number of params")
        topic = params[0]
        channel = params[1] if len(params) >= 2 else ""
        if not is_valid_name(topic):
            raise BadTopic(f"{verb} topic name '{topic}' is not valid")
        if channel and not is_valid_name(channel):
            raise BadChannel(f"{verb} channel name '{channel}' is not valid")
        kind = Register if verb == "REGISTER" else Unregister
        return kind(topic, channel or None)


# -- lookupd -> client --------------------------------------------------------------------------------------

def reply(data: bytes) -> bytes:
    return _I32.pack(len(data)) + data


OK_REPLY = reply(b"OK")


def error_reply(err: ProtocolError) -> bytes:
    """The V1 form of an error: size-prefixed text, no frame type. Empty for DropConnection."""
    data = err.data()
    return reply(data) if data else b""


def identify_response(tcp_port: int, http_port: int, version: str, broadcast_address: str, hostname: str) -> bytes:
    """Lookupd's IDENTIFY reply data (Go marshals a map, so the keys come out sorted)."""
    return json.dumps({"tcp_port": tcp_port, "http_port": http_port, "version": version,
                       "broadcast_address": broadcast_address, "hostname": hostname},
                      separators=(",", ":"), sort_keys=True).encode()


# -- client (nsqd) role ------------------------------------------------------------------------------------

def magic() -> bytes:
    return MAGIC_V1


def ping() -> bytes:
    return b"PING\n"


def identify(peer: dict) -> bytes:
    body = json.dumps(peer, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _I32.pack(len(body)) + body


def register(topic: str, channel: str | None = None) -> bytes:
    return f"REGISTER {topic} {channel}\n".encode() if channel else f"REGISTER {topic}\n".encode()


def unregister(topic: str, channel: str | None = None) -> bytes:
    return f"UNREGISTER {topic} {channel}\n".encode() if channel else f"UNREGISTER {topic}\n".encode()


def is_error(data: bytes) -> bool:
    """Replies carry no type: an error is recognised by its leading code."""
    return data.startswith(b"E_")


class ReplyDecoder:
    """Incremental `[int32 size][data]` decoder for the nsqd side of a lookupd connection."""

    def __init__(self, max_reply: int = 16 << 20):
        self.max_reply = max_reply
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._buf + bytes(chunk)
        replies = []
        pos = 0
        while len(data) - pos >= 4:
            size = _I32.unpack_from(data, pos)[0]
            if size < 0 or size > self.max_reply:
                raise ValueError(f"bad V1 reply size {size}")
            if len(data) - pos - 4 < size:
                break
            replies.append(data[pos + 4:pos + 4 + size])
            pos += 4 + size
        self._buf = data[pos:]
        return replies
