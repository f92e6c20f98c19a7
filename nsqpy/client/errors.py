"""What the client raises: NSQ's own wire errors (`nsqpy.protocol.errors`, each with `.code` and `.fatal`) for
error frames, and a few client-side conditions that have no wire code."""

from __future__ import annotations

from nsqpy.protocol.errors import ERROR_CLASSES, ProtocolError

__all__ = ["ProtocolError", "ClientError", "ConnectionClosed", "NoConnection", "StoppedError", "from_error_frame"]


class ClientError(Exception):
    """Base of the errors that do not come from an nsqd error frame."""


class ConnectionClosed(ClientError):
    """The connection ended before the reply came (the command may or may not have been applied)."""


class NoConnection(ClientError):
    """No nsqd address could be reached."""


class StoppedError(ClientError):
    """The producer or consumer was stopped."""


def from_error_frame(data: bytes) -> ProtocolError:
    """The data of a type-1 frame ("E_CODE description") -> the matching ProtocolError subclass."""
    text = data.decode("utf-8", "replace")
    code, _, description = text.partition(" ")
    cls = ERROR_CLASSES.get(code)
    if cls is None:  # a code this client does not know: keep it, and assume fatal as nsqd's errors mostly are
        return ProtocolError(description, code=code or "E_INVALID", fatal=True)
    return cls(description)
