"""IDENTIFY (spec 1.6/1.7): every field's valid and invalid values, the reply, and the JSON response bytes."""

import json

import pytest

from nsqpy.protocol.errors import BadBody, IdentifyFailed
from nsqpy.protocol.identify import ServerSettings, default_client_settings, negotiate_identify
from nsqpy.protocol.limits import Limits

SERVER = ServerSettings()


def negotiate(server=SERVER, **fields):
    return negotiate_identify(json.dumps(fields).encode(), server)


def test_plain_identify_replies_ok_and_keeps_defaults():
    settings, reply = negotiate(client_id="c", hostname="h", user_agent="ua", short_id="ignored")
    assert reply == b"OK"
    assert (settings.client_id, settings.hostname, settings.user_agent) == ("c", "h", "ua")
    assert (settings.heartbeat_interval_ms, settings.output_buffer_size, settings.output_buffer_timeout_ms,
            settings.msg_timeout_ms, settings.sample_rate) == (30000, 16384, 250, 60000, 0)
    assert not (settings.tls_v1 or settings.snappy or settings.deflate)


def test_feature_negotiation_response_bytes():
    _, reply = negotiate(feature_negotiation=True)
    assert reply == (b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
                     b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
                     b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,'
                     b'"output_buffer_timeout":250}')


def test_response_reflects_negotiated_values():
    server = ServerSettings(Limits(max_deflate_level=9), tls_available=True, auth_required=True,
                            topology_in_response=True)
    settings, reply = negotiate(server, feature_negotiation=True, tls_v1=True, deflate=True, deflate_level=8,
                                sample_rate=50, msg_timeout=5000, output_buffer_size=128,
                                output_buffer_timeout=100, topology_zone="z")
    doc = json.loads(reply)
    assert (doc["tls_v1"], doc["deflate"], doc["deflate_level"], doc["snappy"], doc["auth_required"]) == (
        True, True, 8, False, True)
    assert (doc["sample_rate"], doc["msg_timeout"], doc["output_buffer_size"], doc["output_buffer_timeout"]) == (
        50, 5000, 128, 100)
    assert (doc["topology_zone"], doc["topology_region"]) == ("z", "")
    assert settings.tls_v1 and settings.deflate and settings.deflate_level == 8


@pytest.mark.parametrize("fields, granted", [
    ({"tls_v1": True}, (False, False, False)),  # no certificate configured
    ({"snappy": True}, (False, True, False)),
    ({"deflate": True}, (False, False, True)),
])
def test_upgrades_granted(fields, granted):
    settings, _ = negotiate(feature_negotiation=True, **fields)
    assert (settings.tls_v1, settings.snappy, settings.deflate) == granted


def test_upgrades_need_feature_negotiation():
    settings, reply = negotiate(snappy=True, deflate=True)
    assert reply == b"OK" and not settings.snappy and not settings.deflate


@pytest.mark.parametrize("level, max_level, expected", [(0, 6, 6), (-3, 6, 6), (3, 6, 3), (9, 6, 6), (0, 4, 4)])
def test_deflate_level(level, max_level, expected):
    settings, reply = negotiate(ServerSettings(Limits(max_deflate_level=max_level)), feature_negotiation=True,
                                deflate=True, deflate_level=level)
    assert settings.deflate_level == expected == json.loads(reply)["deflate_level"]


def test_snappy_and_deflate_together_fail():
    with pytest.raises(IdentifyFailed) as info:
        negotiate(feature_negotiation=True, snappy=True, deflate=True)
    assert info.value.data() == b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
    assert info.value.fatal


VALID = [
    ("heartbeat_interval", -1, "heartbeat_interval_ms", 0),
    ("heartbeat_interval", 0, "heartbeat_interval_ms", 30000),
    ("heartbeat_interval", 1000, "heartbeat_interval_ms", 1000),
    ("heartbeat_interval", 60000, "heartbeat_interval_ms", 60000),
    ("output_buffer_size", -1, "output_buffer_size", 1),
    ("output_buffer_size", 0, "output_buffer_size", 16384),
    ("output_buffer_size", 64, "output_buffer_size", 64),
    ("output_buffer_size", 65536, "output_buffer_size", 65536),
    ("output_buffer_timeout", -1, "output_buffer_timeout_ms", 0),
    ("output_buffer_timeout", 0, "output_buffer_timeout_ms", 250),
    ("output_buffer_timeout", 25, "output_buffer_timeout_ms", 25),
    ("output_buffer_timeout", 30000, "output_buffer_timeout_ms", 30000),
    ("sample_rate", 0, "sample_rate", 0),
    ("sample_rate", 99, "sample_rate", 99),
    ("msg_timeout", 0, "msg_timeout_ms", 60000),
    ("msg_timeout", 1000, "msg_timeout_ms", 1000),
    ("msg_timeout", 900000, "msg_timeout_ms", 900000),
]


@pytest.mark.parametrize("key, value, attr, expected", VALID)
def test_valid_field(key, value, attr, expected):
    settings, _ = negotiate(**{key: value})
    assert getattr(settings, attr) == expected


def test_unbuffered_output_also_disables_the_timeout():
    settings, _ = negotiate(output_buffer_size=-1, output_buffer_timeout=100)
    assert (settings.output_buffer_size, settings.output_buffer_timeout_ms) == (1, 0)


INVALID = [
    ("heartbeat_interval", -2, "IDENTIFY heartbeat interval (-2) is invalid"),
    ("heartbeat_interval", 999, "IDENTIFY heartbeat interval (999) is invalid"),
    ("heartbeat_interval", 60001, "IDENTIFY heartbeat interval (60001) is invalid"),
    ("output_buffer_size", 63, "IDENTIFY output buffer size (63) is invalid"),
    ("output_buffer_size", 65537, "IDENTIFY output buffer size (65537) is invalid"),
    ("output_buffer_size", -2, "IDENTIFY output buffer size (-2) is invalid"),
    ("output_buffer_timeout", 24, "IDENTIFY output buffer timeout (24) is invalid"),
    ("output_buffer_timeout", 30001, "IDENTIFY output buffer timeout (30001) is invalid"),
    ("sample_rate", -1, "IDENTIFY sample rate (-1) is invalid"),
    ("sample_rate", 100, "IDENTIFY sample rate (100) is invalid"),
    ("msg_timeout", 999, "IDENTIFY msg timeout (999) is invalid"),
    ("msg_timeout", -1, "IDENTIFY msg timeout (-1) is invalid"),
    ("msg_timeout", 900001, "IDENTIFY msg timeout (900001) is invalid"),
]


@pytest.mark.parametrize("key, value, text", INVALID)
def test_invalid_field(key, value, text):
    with pytest.raises(BadBody) as info:
        negotiate(**{key: value})
    assert info.value.description == text and info.value.code == "E_BAD_BODY" and info.value.fatal


def test_fields_are_checked_in_nsqd_order():
    with pytest.raises(BadBody) as info:  # heartbeat before the output buffer, timeout before size
        negotiate(heartbeat_interval=1, output_buffer_size=1, output_buffer_timeout=1)
    assert "heartbeat" in info.value.description
    with pytest.raises(BadBody) as info:
        negotiate(output_buffer_size=1, output_buffer_timeout=1)
    assert "timeout" in info.value.description


@pytest.mark.parametrize("body", [
    b"", b"{", b"[]", b'"x"', b"1", b'{"heartbeat_interval":"1000"}', b'{"heartbeat_interval":1000.5}',
    b'{"heartbeat_interval":1e3}', b'{"feature_negotiation":1}', b'{"client_id":5}',
    b'{"sample_rate":4294967296}', b'{"msg_timeout":NaN}',
])
def test_undecodable_json(body):
    with pytest.raises(BadBody) as info:
        negotiate_identify(body, SERVER)
    assert info.value.description == "IDENTIFY failed to decode JSON body"


def test_go_json_quirks():
    settings, _ = negotiate_identify(b"null", SERVER)
    assert settings.heartbeat_interval_ms == 30000
    settings, _ = negotiate_identify(b'{"HEARTBEAT_INTERVAL":2000,"client_id":null}', SERVER)
    assert settings.heartbeat_interval_ms == 2000 and settings.client_id == ""


def test_identify_overwrites_client_id_even_with_empty_string():
    before = default_client_settings(SERVER, "10.0.0.1")
    assert before.client_id == before.hostname == "10.0.0.1"
    settings, _ = negotiate_identify(b"{}", SERVER, before)
    assert settings.client_id == "" and settings.hostname == ""
    assert negotiate(heartbeat_interval=-1)[0].heartbeats_disabled
