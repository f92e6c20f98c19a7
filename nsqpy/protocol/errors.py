"""NSQ wire errors: one class per error code, each knowing whether it is fatal.

Every error the protocol layer or a handler can report is a `ProtocolError`. One boundary (the session) turns
it into bytes with `.frame()` (V2) or `nsqpy.protocol.v1.error_reply()` (lookupd) and closes the connection
when `.fatal` is true. Handlers raise; they never write error frames themselves.

Descriptions are `str`. Parts that echo raw client bytes (an unknown verb, an unparsable number) are decoded
with `surrogateescape`, so `.data()` gives back exactly the bytes NSQ would have sent.
"""

from __future__ import annotations

from nsqpy.protocol.frames import FRAME_ERROR, encode_frame

__all__ = [
    "ProtocolError", "DropConnection", "ERROR_CLASSES",
    "BadProtocol", "Invalid", "BadBody", "BadTopic", "BadChannel", "BadMessage",
    "PubFailed", "MpubFailed", "DpubFailed", "SubFailed", "TooManyChannelConsumers", "IdentifyFailed",
    "AuthDisabled", "AuthFailed", "AuthFirst", "Unauthorized", "AuthError",
    "FinFailed", "ReqFailed", "TouchFailed",
    "raw_text", "go_quote",
]


class ProtocolError(Exception):
    """An error with an NSQ wire code. Subclasses fix `code` and `fatal`."""

    code: str = "E_INVALID"
    fatal: bool = True

    def __init__(self, description: str = "", *, code: str | None = None, fatal: bool | None = None):
        super().__init__(description)
        self.description = description
        if code is not None:
            self.code = code
        if fatal is not None:
            self.fatal = fatal

    def data(self) -> bytes:
        """The error text as sent on the wire: `"<CODE> <description>"` (just the code if no description)."""
        text = f"{self.code} {self.description}" if self.description else self.code
        return text.encode("utf-8", "surrogateescape")

    def frame(self) -> bytes:
        """The V2 error frame (frame type 1) carrying `data()`."""
        return encode_frame(FRAME_ERROR, self.data())

    def __str__(self) -> str:
        return self.data().decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.description!r}, fatal={self.fatal})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ProtocolError) and self.code == other.code
                and self.description == other.description and self.fatal == other.fatal)

    def __hash__(self) -> int:
        return hash((self.code, self.description, self.fatal))


class DropConnection(ProtocolError):
    """Close the connection and send nothing: NSQ's reaction to a command line longer than its 16 KiB read
    buffer, or to a connection that ends before the 4 magic bytes arrive."""

    code = ""
    fatal = True

    def data(self) -> bytes:
        return b""

    def frame(self) -> bytes:
        return b""


def _error_class(name: str, code: str, fatal: bool = True) -> type[ProtocolError]:
    return type(name, (ProtocolError,), {"code": code, "fatal": fatal, "__doc__": f"`{code}`"})


BadProtocol = _error_class("BadProtocol", "E_BAD_PROTOCOL")
Invalid = _error_class("Invalid", "E_INVALID")
BadBody = _error_class("BadBody", "E_BAD_BODY")
BadTopic = _error_class("BadTopic", "E_BAD_TOPIC")
BadChannel = _error_class("BadChannel", "E_BAD_CHANNEL")
BadMessage = _error_class("BadMessage", "E_BAD_MESSAGE")
PubFailed = _error_class("PubFailed", "E_PUB_FAILED")
MpubFailed = _error_class("MpubFailed", "E_MPUB_FAILED")
DpubFailed = _error_class("DpubFailed", "E_DPUB_FAILED")
SubFailed = _error_class("SubFailed", "E_SUB_FAILED")
IdentifyFailed = _error_class("IdentifyFailed", "E_IDENTIFY_FAILED")
AuthDisabled = _error_class("AuthDisabled", "E_AUTH_DISABLED")
AuthFailed = _error_class("AuthFailed", "E_AUTH_FAILED")
AuthFirst = _error_class("AuthFirst", "E_AUTH_FIRST")
Unauthorized = _error_class("Unauthorized", "E_UNAUTHORIZED")
AuthError = _error_class("AuthError", "E_AUTH_ERROR")
# SUB over --max-channel-consumers: nsqd's code sends this code (spec 1.4's table says E_SUB_FAILED; the code wins).
TooManyChannelConsumers = _error_class("TooManyChannelConsumers", "E_TOO_MANY_CHANNEL_CONSUMERS")
# The only non-fatal errors: the client keeps its connection (spec 1.4).
FinFailed = _error_class("FinFailed", "E_FIN_FAILED", fatal=False)
ReqFailed = _error_class("ReqFailed", "E_REQ_FAILED", fatal=False)
TouchFailed = _error_class("TouchFailed", "E_TOUCH_FAILED", fatal=False)

# code -> class, for tests and for clients that turn a received error frame back into an exception.
ERROR_CLASSES: dict[str, type[ProtocolError]] = {
    cls.code: cls for cls in (
        BadProtocol, Invalid, BadBody, BadTopic, BadChannel, BadMessage, PubFailed, MpubFailed, DpubFailed,
        SubFailed, TooManyChannelConsumers, IdentifyFailed, AuthDisabled, AuthFailed, AuthFirst, Unauthorized, AuthError,
        FinFailed, ReqFailed, TouchFailed)
}


def raw_text(raw: bytes) -> str:
    """Client bytes echoed verbatim in an error (Go's `%s` of a []byte)."""
    return raw.decode("utf-8", "surrogateescape")


_GO_ESCAPES = {0x07: "\\a", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x0B: "\\v",
               0x22: '\\"', 0x5C: "\\\\"}


def go_quote(raw: bytes) -> str:
    """Go's `%q` of a string holding `raw`: printable characters as-is, invalid UTF-8 bytes as `\\xNN`."""
    out = ['"']
    text = raw.decode("utf-8", "surrogateescape")
    for ch in text:
        cp = ord(ch)
        if cp in _GO_ESCAPES:
            out.append(_GO_ESCAPES[cp])
        elif 0xDC80 <= cp <= 0xDCFF:  # an undecodable byte kept by surrogateescape
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif cp < 0x80:
            out.append(f"\\x{cp:02x}")
        elif cp <= 0xFFFF:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)
