"""What the client raises: NSQ's own wire errors (`nsqpy.protocol.errors`, each with `.code` and `.fatal`) for
error frames, and a few client-side conditions that have no wire code."""

from __future__ import annotations

import os

from nsqpy.protocol.errors import ERROR_CLASSES, ProtocolError
from nsqpy.protocol.names import MAX_NAME_LENGTH, is_valid_name

__all__ = ["ProtocolError", "ClientError", "ConnectionClosed", "NoConnection", "StoppedError", "InvalidName",
           "check_name", "describe", "from_error_frame"]


class ClientError(Exception):
    """Base of the errors that do not come from an nsqd error frame."""


class ConnectionClosed(ClientError):
    """The connection ended before the reply came (the command may or may not have been applied)."""


class NoConnection(ClientError):
    """No nsqd address could be reached."""


class StoppedError(ClientError):
    """The producer or consumer was stopped."""


class InvalidName(ClientError, ValueError):
    """A topic or channel name nsqd would refuse (E_BAD_TOPIC / E_BAD_CHANNEL), caught before sending."""


NAME_RULE = (f"NSQ's rule: 1-{MAX_NAME_LENGTH} characters from [.a-zA-Z0-9_-], optionally ending in #ephemeral "
             "(counted in the length)")


def check_name(kind: str, name) -> None:
    """Raise InvalidName unless `name` is a valid topic or channel name (`kind` says which, for the message)."""
    if not isinstance(name, (str, bytes)) or not is_valid_name(name):
        raise InvalidName(f"invalid {kind} name {name!r}: {NAME_RULE}")


def from_error_frame(data: bytes) -> ProtocolError:
    """The data of a type-1 frame ("E_CODE description") -> the matching ProtocolError subclass."""
    text = data.decode("utf-8", "replace")
    code, _, description = text.partition(" ")
    cls = ERROR_CLASSES.get(code)
    if cls is None:  # a code this client does not know: keep it, and assume fatal as nsqd's errors mostly are
        return ProtocolError(description, code=code or "E_INVALID", fatal=True)
    return cls(description)


def describe(err: BaseException) -> str:
    """An exception as a short phrase for a one-line message ('connection refused', 'timed out', ...)."""
    reason = getattr(err, "reason", None)          # urllib's URLError wraps the socket error
    if isinstance(reason, BaseException):
        return describe(reason)
    if isinstance(err, TimeoutError) or "timed out" in str(err):
        return "timed out"
    if isinstance(err, OSError) and (err.errno or err.strerror):
        text = os.strerror(err.errno) if err.errno else err.strerror   # asyncio's text adds the address
        return text[0].lower() + text[1:]
    return str(err) or type(err).__name__
