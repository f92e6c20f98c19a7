"""IDENTIFY: validate a client's JSON against the server's settings and build the reply (spec 1.6, 1.7).

`negotiate_identify(body, server)` is a pure function. It decodes the JSON the way Go's encoding/json fills
nsqd's struct (keys matched case-insensitively, unknown keys ignored, a wrong JSON type is a decode error,
`null` leaves the default), applies nsqd's checks in nsqd's order and returns the client's settings plus the
reply data: `OK`, or the JSON response when feature_negotiation is true. After sending that reply the session
performs the granted upgrades in order (TLS, then snappy or deflate), each followed by one more `OK` frame.
The bounds checked are `server.limits`, the same `Limits` object the parser and the broker hold (in ms, the
unit of IDENTIFY's fields, so a check compares without converting).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from nsqpy.protocol.errors import BadBody, IdentifyFailed
from nsqpy.protocol.gojson import INT32, INT64, decode_struct
from nsqpy.protocol.limits import NSQ_DEFAULTS, Limits

__all__ = ["ServerSettings", "ClientSettings", "negotiate_identify", "default_client_settings"]

DEFAULT_DEFLATE_LEVEL = 6  # nsqd's level when a client asks for deflate without one (not --max-deflate-level)

@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What IDENTIFY depends on: nsqd's limits (the one `Limits` the parser and the broker hold too, from
    `NsqdOptions.limits()`; NSQ's defaults) and the features the options turn on."""

    limits: Limits = NSQ_DEFAULTS
    version: str = "1.3.0"
    tls_available: bool = False               # a certificate and key are configured
    snappy_enabled: bool = True               # --snappy
    deflate_enabled: bool = True              # --deflate
    auth_required: bool = False               # any --auth-http-address
    tls_required: bool = False                # --tls-required true or tcp-https: commands but IDENTIFY need TLS
    topology_in_response: bool = False        # [master] adds topology_region/zone to the JSON response


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What one connection negotiated. heartbeat_interval_ms == 0 and output_buffer_timeout_ms == 0 mean off."""

    client_id: str
    hostname: str
    user_agent: str
    heartbeat_interval_ms: int
    output_buffer_size: int
    output_buffer_timeout_ms: int
    msg_timeout_ms: int
    sample_rate: int = 0
    feature_negotiation: bool = False
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = DEFAULT_DEFLATE_LEVEL
    topology_region: str = ""
    topology_zone: str = ""

    @property
    def heartbeats_disabled(self) -> bool:
        return self.heartbeat_interval_ms <= 0


def default_client_settings(server: ServerSettings, remote_ip: str = "") -> ClientSettings:
    """A connection's settings before (or without) IDENTIFY."""
    limits = server.limits
    return ClientSettings(
        client_id=remote_ip, hostname=remote_ip, user_agent="",
        heartbeat_interval_ms=limits.client_timeout_ms // 2,
        output_buffer_size=limits.default_output_buffer_size,
        output_buffer_timeout_ms=limits.output_buffer_timeout_ms,
        msg_timeout_ms=limits.msg_timeout_ms)


# IDENTIFY's JSON fields: key -> (type, int range, default).
_FIELDS = {
    "client_id": (str, None, ""), "hostname": (str, None, ""), "user_agent": (str, None, ""),
    "feature_negotiation": (bool, None, False),
    "heartbeat_interval": (int, INT64, 0), "output_buffer_size": (int, INT64, 0),
    "output_buffer_timeout": (int, INT64, 0), "msg_timeout": (int, INT64, 0),
    "sample_rate": (int, INT32, 0), "deflate_level": (int, INT64, 0),
    "tls_v1": (bool, None, False), "snappy": (bool, None, False), "deflate": (bool, None, False),
    "topology_region": (str, None, ""), "topology_zone": (str, None, ""),
}


def negotiate_identify(body: bytes, server: ServerSettings,
                       current: ClientSettings | None = None) -> tuple[ClientSettings, bytes]:
    """Validate an IDENTIFY body; return (settings, reply data). Raises BadBody / IdentifyFailed (fatal)."""
    data = decode_struct(body, _FIELDS)
    if data is None:
        raise BadBody("IDENTIFY failed to decode JSON body")
    base = current or default_client_settings(server)
    heartbeat = _heartbeat(data["heartbeat_interval"], base, server)
    buffer_size, buffer_timeout = _output_buffer(data["output_buffer_size"], data["output_buffer_timeout"],
                                                 base, server)
    sample_rate = data["sample_rate"]
    if not 0 <= sample_rate <= 99:
        raise BadBody(f"IDENTIFY sample rate ({sample_rate}) is invalid")
    msg_timeout = data["msg_timeout"]
    if msg_timeout == 0:
        msg_timeout = base.msg_timeout_ms
    elif not 1000 <= msg_timeout <= server.limits.max_msg_timeout_ms:
        raise BadBody(f"IDENTIFY msg timeout ({msg_timeout}) is invalid")
    settings = replace(
        base, client_id=data["client_id"], hostname=data["hostname"], user_agent=data["user_agent"],
        heartbeat_interval_ms=heartbeat, output_buffer_size=buffer_size, output_buffer_timeout_ms=buffer_timeout,
        sample_rate=sample_rate, msg_timeout_ms=msg_timeout, feature_negotiation=data["feature_negotiation"],
        topology_region=data["topology_region"], topology_zone=data["topology_zone"])
    if not settings.feature_negotiation:
        return settings, b"OK"
    return _negotiate_features(settings, data, server)


def _heartbeat(value: int, base: ClientSettings, server: ServerSettings) -> int:
    if value == -1:
        return 0
    if value == 0:
        return base.heartbeat_interval_ms
    if 1000 <= value <= server.limits.max_heartbeat_interval_ms:
        return value
    raise BadBody(f"IDENTIFY heartbeat interval ({value}) is invalid")


def _output_buffer(size: int, timeout: int, base: ClientSettings, server: ServerSettings) -> tuple[int, int]:
    limits = server.limits
    if timeout == -1:
        new_timeout = 0
    elif timeout == 0:
        new_timeout = base.output_buffer_timeout_ms
    elif limits.min_output_buffer_timeout_ms <= timeout <= limits.max_output_buffer_timeout_ms:
        new_timeout = timeout
    else:
        raise BadBody(f"IDENTIFY output buffer timeout ({timeout}) is invalid")
    if size == -1:
        return 1, 0  # unbuffered: every write goes straight out
    if size == 0:
        return base.output_buffer_size, new_timeout
    if 64 <= size <= limits.max_output_buffer_size:
        return size, new_timeout
    raise BadBody(f"IDENTIFY output buffer size ({size}) is invalid")


def _negotiate_features(settings: ClientSettings, data: dict,
                        server: ServerSettings) -> tuple[ClientSettings, bytes]:
    tls = server.tls_available and data["tls_v1"]
    deflate = server.deflate_enabled and data["deflate"]
    snappy = server.snappy_enabled and data["snappy"]
    limits = server.limits
    level = data["deflate_level"] if deflate and data["deflate_level"] > 0 else DEFAULT_DEFLATE_LEVEL
    level = min(level, limits.max_deflate_level)
    if deflate and snappy:
        raise IdentifyFailed("cannot enable both deflate and snappy compression")
    settings = replace(settings, tls_v1=tls, deflate=deflate, snappy=snappy, deflate_level=level)
    response = {
        "max_rdy_count": limits.max_rdy_count, "version": server.version,
        "max_msg_timeout": limits.max_msg_timeout_ms, "msg_timeout": settings.msg_timeout_ms,
        "tls_v1": tls, "deflate": deflate, "deflate_level": level, "max_deflate_level": limits.max_deflate_level,
        "snappy": snappy, "sample_rate": settings.sample_rate, "auth_required": server.auth_required,
        "output_buffer_size": settings.output_buffer_size,
        "output_buffer_timeout": settings.output_buffer_timeout_ms,
    }
    if server.topology_in_response:
        response["topology_region"] = settings.topology_region
        response["topology_zone"] = settings.topology_zone
    return settings, json.dumps(response, separators=(",", ":")).encode()
