"""Client states (the `state` field of /stats) and which verb each state allows (spec 1.3, 1.4).

The V2 parser tracks the state itself: only SUB (init -> subscribed) and CLS (subscribed -> closing) change
it, and if either fails in the broker the error is fatal, so nothing parsed after it matters.
"""

from __future__ import annotations

from nsqpy.protocol.errors import Invalid

__all__ = [
    "STATE_INIT", "STATE_DISCONNECTED", "STATE_CONNECTED", "STATE_SUBSCRIBED", "STATE_CLOSING",
    "ALLOWED_STATES", "IGNORED_IN", "TRANSITIONS", "check_state", "ANY_STATE",
]

STATE_INIT = 0
STATE_DISCONNECTED = 1
STATE_CONNECTED = 2
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

ANY_STATE = frozenset({STATE_INIT, STATE_DISCONNECTED, STATE_CONNECTED, STATE_SUBSCRIBED, STATE_CLOSING})
_IN_FLIGHT_OPS = frozenset({STATE_SUBSCRIBED, STATE_CLOSING})

# verb -> states in which it is accepted.
ALLOWED_STATES: dict[str, frozenset[int]] = {
    "IDENTIFY": frozenset({STATE_INIT}),
    "AUTH": frozenset({STATE_INIT}),
    "SUB": frozenset({STATE_INIT}),
    "PUB": ANY_STATE,
    "MPUB": ANY_STATE,
    "DPUB": ANY_STATE,
    "RDY": frozenset({STATE_SUBSCRIBED}),
    "FIN": _IN_FLIGHT_OPS,
    "REQ": _IN_FLIGHT_OPS,
    "TOUCH": _IN_FLIGHT_OPS,
    "CLS": frozenset({STATE_SUBSCRIBED}),
    "NOP": ANY_STATE,
}

# verb -> states in which the command is dropped silently before any parameter is looked at.
IGNORED_IN: dict[str, frozenset[int]] = {"RDY": frozenset({STATE_CLOSING})}

# verb -> state after the command succeeded (verbs that change nothing are absent).
TRANSITIONS: dict[str, int] = {"SUB": STATE_SUBSCRIBED, "CLS": STATE_CLOSING}


def check_state(verb: str, state: int) -> Invalid | None:
    """The fatal `E_INVALID cannot <VERB> in current state` for a verb the state does not allow, else None.
    (Callers check `IGNORED_IN` first.)"""
    if state in ALLOWED_STATES[verb]:
        return None
    return Invalid(f"cannot {verb} in current state")
