"""nsqpy.config against NSQ v1.3.0's flag tables and Go's flag/duration rules.

The default tables below are the spec's (nsq-reference.md sections 3, 4.3, 5.3),
written as the spec writes them, row by row; every declared option must have a row.
"""
import hashlib
import os
import socket
import zlib

import pytest
from hypothesis import given, strategies as st

from nsqpy.config import (
    DurationError, HelpRequested, LogLevel, NsqadminOptions, NsqdOptions, NsqlookupdOptions, OptionsError,
    TLSRequired, TLSVersion, default_node_id, format_duration, parse, parse_duration, parse_or_exit,
)
from nsqpy.config.kinds import Duration

HOST = socket.gethostname()
NODE_ID = zlib.crc32(hashlib.md5(HOST.encode()).digest()) % 1024
ADMIN_MIN = ["--lookupd-http-address=127.0.0.1:4161"]  # nsqadmin needs one address kind

NSQD_DEFAULTS = [
    ("config", ""), ("version", "false"), ("log-level", "info"), ("log-prefix", "[nsqd] "),
    ("verbose", "false"), ("node-id", str(NODE_ID)), ("worker-id", "false"),
    ("tcp-address", "0.0.0.0:4150"), ("http-address", "0.0.0.0:4151"), ("https-address", "0.0.0.0:4152"),
    ("broadcast-address", HOST), ("broadcast-tcp-port", "0"), ("broadcast-http-port", "0"),
    ("lookupd-tcp-address", "[]"), ("auth-http-address", "[]"), ("auth-http-request-method", "get"),
    ("http-client-connect-timeout", "2s"), ("http-client-request-timeout", "5s"),
    ("topology-region", ""), ("topology-zone", ""), ("enable-experiment", "[]"),
    ("data-path", ""), ("mem-queue-size", "10000"), ("max-bytes-per-file", "104857600"),
    ("sync-every", "2500"), ("sync-timeout", "2s"), ("queue-scan-worker-pool-max", "4"),
    ("queue-scan-selection-count", "20"), ("msg-timeout", "1m0s"), ("max-msg-timeout", "15m0s"),
    ("max-msg-size", "1048576"), ("max-req-timeout", "1h0m0s"), ("max-body-size", "5242880"),
    ("max-heartbeat-interval", "1m0s"), ("max-rdy-count", "2500"), ("max-output-buffer-size", "65536"),
    ("max-output-buffer-timeout", "30s"), ("min-output-buffer-timeout", "25ms"),
    ("output-buffer-timeout", "250ms"), ("max-channel-consumers", "0"), ("statsd-address", ""),
    ("statsd-interval", "1m0s"), ("statsd-mem-stats", "true"), ("statsd-prefix", "nsq.%s"),
    ("statsd-udp-packet-size", "508"), ("statsd-exclude-ephemeral", "false"),
    ("e2e-processing-latency-percentile", "[]"), ("e2e-processing-latency-window-time", "10m0s"),
    ("tls-cert", ""), ("tls-key", ""), ("tls-client-auth-policy", ""), ("tls-root-ca-file", ""),
    ("tls-required", "false"), ("tls-min-version", "tls1.0"), ("deflate", "true"),
    ("max-deflate-level", "6"), ("snappy", "true"),
    ("workers", str(os.cpu_count())),  # nsqpy only
    ("compile-only", "false"), ("leftovers", "false"), ("discard-leftovers", ""),  # nsqpy only
    ("max-disk-bytes-per-topic", str(16 << 30)),  # nsqpy only
    ("crash-on-body", ""), ("crash-on-forwarded-body", ""),  # nsqpy only (fault-injection tests)
    ("ring-budget", str(1 << 30)), ("external-producers", "8"), ("max-in-flight-per-worker", str(1 << 17)),
    ("http-workers", "2"), ("http-worker-class", "asgi"), ("producer-placement", "auto"),
    ("producer-move-in-rate", "20000"), ("producer-move-out-rate", "40000"), ("producer-busy-percent", "80"),
    ("max-attempts", "0"), ("dead-letter-topic-suffix", ".dead"), ("message-ttl", "0s"),  # nsqpy only (issue 49)
    ("max-channel-depth", "0"), ("max-channel-bytes", "0"), ("channel-overflow", "block"),
]
NSQLOOKUPD_DEFAULTS = [
    ("config", ""), ("version", "false"), ("verbose", "false"), ("log-level", "info"),
    ("log-prefix", "[nsqlookupd] "), ("tcp-address", "0.0.0.0:4160"), ("http-address", "0.0.0.0:4161"),
    ("broadcast-address", HOST), ("inactive-producer-timeout", "5m0s"), ("tombstone-lifetime", "45s"),
    ("http-workers", "2"),  # nsqpy only
]
NSQADMIN_DEFAULTS = [
    ("config", ""), ("version", "false"), ("verbose", "false"), ("log-level", "info"),
    ("log-prefix", "[nsqadmin] "), ("http-address", "0.0.0.0:4171"), ("base-path", "/"),
    ("lookupd-http-address", "['127.0.0.1:4161']"), ("nsqd-http-address", "[]"), ("graphite-url", ""),
    ("proxy-graphite", "false"), ("statsd-prefix", "nsq.%s"), ("statsd-counter-format", "stats.counters.%s.count"),
    ("statsd-gauge-format", "stats.gauges.%s"), ("statsd-interval", "1m0s"), ("notification-http-endpoint", ""),
    ("http-client-connect-timeout", "2s"), ("http-client-request-timeout", "5s"),
    ("http-client-tls-insecure-skip-verify", "false"), ("http-client-tls-root-ca-file", ""),
    ("http-client-tls-cert", ""), ("http-client-tls-key", ""), ("allow-config-from-cidr", "127.0.0.1/8"),
    ("acl-http-header", "X-Forwarded-User"), ("admin-user", "[]"), ("dev-static-dir", ""),
]


def spec_text(spec, value) -> str:
    """Render a value the way the spec tables write defaults."""
    if isinstance(spec.kind, Duration):
        return format_duration(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, TLSRequired):
        return {0: "false", 1: "tcp-https", 2: "true"}[value]
    if isinstance(value, TLSVersion):
        return "tls1.%d" % (value - 0x0301)
    if isinstance(value, LogLevel):
        return value.name.lower()
    return str(value)


@pytest.mark.parametrize("cls, argv, table", [
    (NsqdOptions, [], NSQD_DEFAULTS),
    (NsqlookupdOptions, [], NSQLOOKUPD_DEFAULTS),
    (NsqadminOptions, ADMIN_MIN, NSQADMIN_DEFAULTS),
], ids=["nsqd", "nsqlookupd", "nsqadmin"])
def test_defaults_match_spec_tables(cls, argv, table):
    opts = cls.parse(argv)
    specs = {spec.name: spec for spec in cls.specs()}
    assert sorted(specs) == sorted(name for name, _ in table), "every option has exactly one row"
    for name, expected in table:
        spec = specs[name]
        assert spec.attr == name.replace("-", "_")
        assert spec_text(spec, getattr(opts, spec.attr)) == expected, name


def test_node_id_is_crc32_of_md5_of_hostname():
    assert zlib.crc32(b"123456789") == 0xCBF43926  # zlib's crc32 is Go's ChecksumIEEE
    assert default_node_id("localhost") == 16
    assert default_node_id("nsqd-1.example.com") == 995
    assert NsqdOptions().node_id == NODE_ID


def test_nsqpy_only_options_are_marked_and_documented():
    extras = [spec for spec in NsqdOptions.specs() if spec.nsqpy_only]
    assert [spec.name for spec in extras] == ["workers", "max-disk-bytes-per-topic", "crash-on-body",
                                              "crash-on-forwarded-body", "ring-budget", "external-producers",
                                              "max-in-flight-per-worker", "http-workers", "http-worker-class",
                                              "producer-placement", "producer-move-in-rate", "producer-move-out-rate",
                                              "producer-busy-percent", "max-attempts",
                                              "dead-letter-topic-suffix", "message-ttl", "max-channel-depth",
                                              "max-channel-bytes", "channel-overflow", "compile-only", "leftovers",
                                              "discard-leftovers"]
    assert all(spec.help.startswith("nsqpy only:") for spec in extras)


GO_DURATIONS = [  # text, nanoseconds, Go's String() of it
    ("0", 0, "0s"), ("-0", 0, "0s"), ("+0", 0, "0s"), ("10ns", 10, "10ns"), ("1.1ns", 1, "1ns"),
    ("300us", 300_000, "300µs"), ("300µs", 300_000, "300µs"), ("300μs", 300_000, "300µs"),
    ("1.5us", 1_500, "1.5µs"), ("250ms", 250_000_000, "250ms"), ("25ms", 25_000_000, "25ms"),
    (".5s", 500_000_000, "500ms"), ("5.s", 5_000_000_000, "5s"), ("2s", 2_000_000_000, "2s"),
    ("1.000000001s", 1_000_000_001, "1.000000001s"), ("45s", 45_000_000_000, "45s"),
    ("1m0s", 60_000_000_000, "1m0s"), ("60s", 60_000_000_000, "1m0s"), ("90s", 90_000_000_000, "1m30s"),
    ("15m", 900_000_000_000, "15m0s"), ("2h", 7_200_000_000_000, "2h0m0s"),
    ("1.5h", 5_400_000_000_000, "1h30m0s"), ("1h2m3.5s", 3_723_500_000_000, "1h2m3.5s"),
    ("-1m30s", -90_000_000_000, "-1m30s"), ("1h1h", 7_200_000_000_000, "2h0m0s"),
    ("9223372036854775807ns", 2**63 - 1, "2562047h47m16.854775807s"),
    ("-9223372036854775808ns", -(2**63), "-2562047h47m16.854775808s"),
]


@pytest.mark.parametrize("text, nanoseconds, go_string", GO_DURATIONS)
def test_go_durations_both_ways(text, nanoseconds, go_string):
    assert parse_duration(text) == nanoseconds
    assert format_duration(nanoseconds) == go_string
    assert parse_duration(go_string) == nanoseconds


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_go_duration_string_round_trips(nanoseconds):
    assert parse_duration(format_duration(nanoseconds)) == nanoseconds


@pytest.mark.parametrize("text, message", [
    ("", 'time: invalid duration ""'), ("1", 'time: missing unit in duration "1"'),
    ("10", 'time: missing unit in duration "10"'), (".s", 'time: invalid duration ".s"'),
    ("-", 'time: invalid duration "-"'), ("s", 'time: invalid duration "s"'),
    ("1x", 'time: unknown unit "x" in duration "1x"'), ("1 s", 'time: unknown unit " s" in duration "1 s"'),
    ("1e3s", 'time: unknown unit "e" in duration "1e3s"'), ("1S", 'time: unknown unit "S" in duration "1S"'),
    ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
    ("2562048h", 'time: invalid duration "2562048h"'), ("1s-1s", 'time: unknown unit "s-" in duration "1s-1s"'),
])
def test_go_duration_rejects(text, message):
    with pytest.raises(DurationError) as caught:
        parse_duration(text)
    assert str(caught.value) == message


@pytest.mark.parametrize("argv", [
    ["-msg-timeout=2s"], ["--msg-timeout=2s"], ["-msg-timeout", "2s"], ["--msg-timeout", "2s"],
    ["-msg-timeout=1s", "-msg-timeout=2s"],  # the last one wins
])
def test_value_flag_forms(argv):
    assert NsqdOptions.parse(argv).msg_timeout == 2_000_000_000


@pytest.mark.parametrize("argv, deflate, msg_timeout", [
    (["-deflate"], True, "1m0s"),
    (["--deflate=false"], False, "1m0s"),
    (["-deflate=0", "-msg-timeout=5s"], False, "5s"),
    (["-deflate=F"], False, "1m0s"),
    # A bool never takes the next argument: "false" is the first non-flag, and parsing stops there.
    (["-deflate=false", "-deflate", "false", "-msg-timeout=5s"], True, "1m0s"),
    (["--", "-deflate=false"], True, "1m0s"),  # -- ends the flags
    (["-", "-deflate=false"], True, "1m0s"),  # so does a lone -
    (["-tls-cert=c", "-tls-key=k", "-tls-required", "tcp-https", "-deflate=false"], True, "1m0s"),  # -tls-required is bool-like too
])
def test_bool_flag_forms(argv, deflate, msg_timeout):
    opts = NsqdOptions.parse(argv)
    assert (opts.deflate, format_duration(opts.msg_timeout)) == (deflate, msg_timeout)


def test_value_flag_takes_next_argument_even_if_it_looks_like_a_flag():
    assert NsqdOptions.parse(["-log-prefix", "-x-"]).log_prefix == "-x-"


@pytest.mark.parametrize("text, value", [
    ("10", 10), ("+10", 10), ("0x10", 16), ("010", 8), ("0o10", 8), ("0b10", 2), ("1_000", 1000), ("-5", -5),
])
def test_int_flags_read_like_go_parseint_base_0(text, value):
    assert NsqdOptions.parse(["-mem-queue-size", text]).mem_queue_size == value


def test_repeatable_flags_accumulate():
    opts = NsqdOptions.parse([
        "-lookupd-tcp-address=a:4160", "--lookupd-tcp-address", "b:4160",
        "-auth-http-address=auth:1", "-auth-http-address=http://auth/x",
        "-e2e-processing-latency-percentile=0.5", "-e2e-processing-latency-percentile=1.0,0.99,0.95",
        "-enable-experiment=topology-aware-consumption",
    ])
    assert opts.lookupd_tcp_address == ["a:4160", "b:4160"]
    assert opts.auth_http_address == ["auth:1", "http://auth/x"]
    assert opts.e2e_processing_latency_percentile == [1.0, 0.99, 0.95, 0.5]  # nsqd keeps them sorted descending
    assert opts.enable_experiment == ["topology-aware-consumption"]
    admin = NsqadminOptions.parse(["-nsqd-http-address=a:4151", "-nsqd-http-address=b:4151",
                                   "-admin-user=ann", "-admin-user=bob"])
    assert (admin.nsqd_http_address, admin.admin_user) == (["a:4151", "b:4151"], ["ann", "bob"])


@pytest.mark.parametrize("argv, field, value", [
    (["-log-level=DEBUG"], "log_level", LogLevel.DEBUG),
    (["-log-level", "Warn"], "log_level", LogLevel.WARN),
    (["-tls-min-version=TLS1.3"], "tls_min_version", TLSVersion.TLS1_3),
    (["-tls-min-version="], "tls_min_version", TLSVersion.TLS1_0),
    (["-tls-required=false"], "tls_required", TLSRequired.NOT_REQUIRED),
    (["-auth-http-request-method=post"], "auth_http_request_method", "post"),
    (["-node-id=0"], "node_id", 0), (["-node-id=1023"], "node_id", 1023),
    (["-max-deflate-level=1"], "max_deflate_level", 1), (["-max-deflate-level=9"], "max_deflate_level", 9),
    (["-workers=3"], "workers", 3),
])
def test_enumerated_and_ranged_values(argv, field, value):
    assert getattr(NsqdOptions.parse(argv), field) == value


def test_tls_required_forms_and_client_auth_policy_forcing_it():
    tls = ["-tls-cert=c.pem", "-tls-key=k.pem"]
    assert NsqdOptions.parse(tls + ["-tls-required"]).tls_required == TLSRequired.REQUIRED
    assert NsqdOptions.parse(tls + ["-tls-required=tcp-https"]).tls_required == TLSRequired.EXCEPT_HTTP
    forced = NsqdOptions.parse(tls + ["-tls-client-auth-policy=require-verify"])
    assert forced.tls_required == TLSRequired.REQUIRED
    kept = NsqdOptions.parse(tls + ["-tls-required=tcp-https", "-tls-client-auth-policy=require"])
    assert kept.tls_required == TLSRequired.EXCEPT_HTTP


def write(tmp_path, text):
    path = tmp_path / "nsqd.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_config_file_and_precedence(tmp_path):
    path = write(tmp_path, """
        msg_timeout = "30s"           # Go duration string
        max_req_timeout = 120000      # TOML integer durations are milliseconds in NSQ
        mem_queue_size = 5
        max_rdy_count = "7"           # go-options also takes numbers as strings
        deflate = false
        snappy = "false"
        nsqlookupd_tcp_addresses = ["a:4160", "b:4160"]
        auth_http_addresses = "x:1,y:2"
        e2e_processing_latency_percentiles = [0.5, 1]
        id = 42
        log_level = "ERROR"
        tls_min_version = "tls1.2"
        statsd_prefix = "file.%s"
        some_future_option = "ignored, as NSQ ignores unknown keys"
        [ignored_table]
        x = 1
    """)
    opts = NsqdOptions.parse(["-config", path, "-mem-queue-size=9", "-statsd-prefix="])
    assert opts.msg_timeout == 30_000_000_000
    assert opts.max_req_timeout == 120_000_000_000
    assert opts.mem_queue_size == 9  # flag beats file
    assert opts.statsd_prefix == ""  # an explicitly empty flag beats the file too
    assert opts.max_rdy_count == 7
    assert (opts.deflate, opts.snappy) == (False, False)
    assert opts.lookupd_tcp_address == ["a:4160", "b:4160"]
    assert opts.auth_http_address == ["x:1", "y:2"]
    assert opts.e2e_processing_latency_percentile == [1.0, 0.5]
    assert opts.node_id == 42
    assert opts.log_level == LogLevel.ERROR
    assert opts.tls_min_version == TLSVersion.TLS1_2
    assert opts.max_body_size == 5242880  # neither: default
    assert opts.config == path


def test_config_file_accepts_flag_spelling_and_tls_required_bool(tmp_path):
    path = write(tmp_path, 'node_id = 7\nlookupd_tcp_address = ["a:1"]\ntls_required = true\n'
                           'tls_cert = "c"\ntls_key = "k"\n')
    opts = NsqdOptions.parse(["--config=" + path])
    assert (opts.node_id, opts.lookupd_tcp_address, opts.tls_required) == (7, ["a:1"], TLSRequired.REQUIRED)


def test_config_file_for_nsqlookupd_and_nsqadmin(tmp_path):
    path = write(tmp_path, 'tombstone_lifetime = "1m"\nnsqlookupd_http_addresses = ["l:4161"]\n'
                           'admin_users = ["ann"]\n')
    assert NsqlookupdOptions.parse(["-config=" + path]).tombstone_lifetime == 60_000_000_000
    admin = NsqadminOptions.parse(["-config=" + path])
    assert (admin.lookupd_http_address, admin.admin_user) == (["l:4161"], ["ann"])


def test_config_value_names_for_get_config():
    opts = NsqdOptions.parse(["-node-id=5", "-lookupd-tcp-address=a:1", "-auth-http-address=b:2",
                              "-e2e-processing-latency-percentile=0.9", "-enable-experiment=x",
                              "-msg-timeout=2s", "-log-level=warn"])
    assert opts.config_value("id") == 5
    assert opts.config_value("nsqlookupd_tcp_addresses") == ["a:1"]
    assert opts.config_value("auth_http_addresses") == ["b:2"]
    assert opts.config_value("e2e_processing_latency_percentiles") == [0.9]
    assert opts.config_value("enable_experiment") == ["x"]
    assert opts.config_value("msg_timeout") == 2_000_000_000
    assert opts.config_value("log_level") == 3
    assert opts.config_value("tls_min_version") == 0x0301
    assert opts.config_value("tls_required") == 0
    assert opts.config_value("statsd_prefix") == "nsq.%s"
    assert type(opts.config_value("log_level")) is int
    for name in ("node_id", "lookupd_tcp_address", "config", "version", "worker_id", "nope"):
        with pytest.raises(KeyError):
            opts.config_value(name)
    admin = NsqadminOptions.parse(ADMIN_MIN)
    assert admin.config_value("nsqlookupd_http_addresses") == ["127.0.0.1:4161"]


def test_limits_for_the_protocol_parser():
    limits = NsqdOptions.parse(["-max-req-timeout=90m", "-msg-timeout=1500us"]).limits()
    assert (limits.max_msg_size, limits.max_body_size, limits.max_rdy_count) == (1048576, 5242880, 2500)
    assert (limits.max_req_timeout_ms, limits.msg_timeout_ms) == (5_400_000, 1)
    assert (limits.max_msg_timeout_ms, limits.client_timeout_ms) == (900_000, 60_000)
    assert (limits.max_heartbeat_interval_ms, limits.output_buffer_timeout_ms) == (60_000, 250)
    assert (limits.min_output_buffer_timeout_ms, limits.max_output_buffer_timeout_ms) == (25, 30_000)
    assert (limits.max_output_buffer_size, limits.max_deflate_level) == (65536, 6)


def test_data_path_empty_means_working_directory(tmp_path):
    assert NsqdOptions().data_directory() == os.getcwd()
    assert NsqdOptions.parse(["-data-path", str(tmp_path)]).data_directory() == str(tmp_path)


FLAG_ERRORS = [
    (NsqdOptions, ["-msg-timeout=abc"], 'invalid value "abc" for flag -msg-timeout: parse error'),
    (NsqdOptions, ["-msg-timeout", "60"], 'invalid value "60" for flag -msg-timeout: parse error'),
    (NsqdOptions, ["-mem-queue-size=ten"], 'invalid value "ten" for flag -mem-queue-size: parse error'),
    (NsqdOptions, ["-mem-queue-size= 1"], 'invalid value " 1" for flag -mem-queue-size: parse error'),
    (NsqdOptions, ["-mem-queue-size=09"], 'invalid value "09" for flag -mem-queue-size: parse error'),
    (NsqdOptions, ["-max-msg-size=9223372036854775808"],
     'invalid value "9223372036854775808" for flag -max-msg-size: value out of range'),
    (NsqdOptions, ["-deflate=yes"], 'invalid boolean value "yes" for -deflate: parse error'),
    (NsqdOptions, ["-node-id=1024"], 'invalid value "1024" for flag -node-id: must be in range [0,1023]'),
    (NsqdOptions, ["-node-id=-1"], 'invalid value "-1" for flag -node-id: must be in range [0,1023]'),
    (NsqdOptions, ["-max-deflate-level=0"], 'invalid value "0" for flag -max-deflate-level: must be in range [1,9]'),
    (NsqdOptions, ["-max-deflate-level=10"],
     'invalid value "10" for flag -max-deflate-level: must be in range [1,9]'),
    (NsqdOptions, ["-workers=0"], 'invalid value "0" for flag -workers: must be at least 1'),
    (NsqdOptions, ["-e2e-processing-latency-percentile=0"],
     'invalid value "0" for flag -e2e-processing-latency-percentile: each percentile must be in range (0,1]'),
    (NsqdOptions, ["-e2e-processing-latency-percentile=0.9,1.5"],
     'invalid value "0.9,1.5" for flag -e2e-processing-latency-percentile: each percentile must be in range (0,1]'),
    (NsqdOptions, ["-e2e-processing-latency-percentile=abc"],
     'invalid value "abc" for flag -e2e-processing-latency-percentile: parse error'),
    (NsqdOptions, ["-log-level=warning"],
     'invalid value "warning" for flag -log-level: invalid log level \'warning\' (debug, info, warn, error, fatal)'),
    (NsqdOptions, ["-tls-min-version=ssl3.0"],
     'invalid value "ssl3.0" for flag -tls-min-version: unknown tlsVersionOption "ssl3.0"'),
    (NsqdOptions, ["-tls-required=maybe"],
     'invalid boolean value "maybe" for -tls-required: strconv.ParseBool: parsing "maybe": invalid syntax'),
    (NsqdOptions, ["-tls-client-auth-policy=none"],
     'invalid value "none" for flag -tls-client-auth-policy: must be "", "require" or "require-verify"'),
    (NsqdOptions, ["-auth-http-request-method=put"],
     'invalid value "put" for flag -auth-http-request-method: must be \'post\' or \'get\''),
    (NsqdOptions, ["-tls-required"], "cannot require TLS client connections (-tls-required, "
                                     "-tls-client-auth-policy) without -tls-cert and -tls-key"),
    (NsqdOptions, ["-tls-cert=c.pem"], "-tls-cert and -tls-key must be given together"),
    (NsqdOptions, ["-producer-move-out-rate=20000"],
     "--producer-move-in-rate must be less than --producer-move-out-rate"),
    (NsqdOptions, ["-nope"], "flag provided but not defined: -nope"),
    (NsqdOptions, ["--nope=1"], "flag provided but not defined: -nope"),
    (NsqdOptions, ["-msg-timeout"], "flag needs an argument: -msg-timeout"),
    (NsqdOptions, ["---msg-timeout=1s"], "bad flag syntax: ---msg-timeout=1s"),
    (NsqdOptions, ["-=1"], "bad flag syntax: -=1"),
    (NsqdOptions, ["-config=/nonexistent/nsqd.toml"],
     "failed to load config file /nonexistent/nsqd.toml - No such file or directory"),
    (NsqlookupdOptions, ["-tombstone-lifetime=1d"], 'invalid value "1d" for flag -tombstone-lifetime: parse error'),
    (NsqlookupdOptions, ["-node-id=1"], "flag provided but not defined: -node-id"),
    (NsqadminOptions, [], "--nsqd-http-address or --lookupd-http-address required"),
    (NsqadminOptions, ["-nsqd-http-address=a:1", "-lookupd-http-address=b:2"],
     "use --nsqd-http-address or --lookupd-http-address not both"),
    (NsqadminOptions, ADMIN_MIN + ["-allow-config-from-cidr=10.0.0.1"],
     'invalid value "10.0.0.1" for flag -allow-config-from-cidr: invalid CIDR address: 10.0.0.1'),
    (NsqadminOptions, ADMIN_MIN + ["-http-client-tls-key=k.pem"],
     "-http-client-tls-cert and -http-client-tls-key must be given together"),
]


@pytest.mark.parametrize("cls, argv, message", FLAG_ERRORS)
def test_invalid_flags_give_one_line_and_exit_2(cls, argv, message, capsys):
    with pytest.raises(OptionsError) as caught:
        cls.parse(argv)
    assert str(caught.value) == message
    with pytest.raises(SystemExit) as exited:
        parse_or_exit(cls, argv, cls.PROG)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", message + "\n")


FILE_ERRORS = [
    ('msg_timeout = "abc"', 'invalid value "abc" for key msg_timeout: time: invalid duration "abc"'),
    ("msg_timeout = 1.5", "invalid value 1.5 for key msg_timeout: wrong type, expected a duration string "
                          "or integer milliseconds"),
    ("mem_queue_size = 1.5", "invalid value 1.5 for key mem_queue_size: wrong type, expected an integer"),
    ('mem_queue_size = "0x10"', 'invalid value "0x10" for key mem_queue_size: parse error'),
    ("deflate = 1", "invalid value 1 for key deflate: wrong type, expected a boolean"),
    ('deflate = "yes"', 'invalid value "yes" for key deflate: parse error'),
    ("tcp_address = 4150", "invalid value 4150 for key tcp_address: wrong type, expected a string"),
    ("nsqlookupd_tcp_addresses = [1, 2]",
     "invalid value [1, 2] for key nsqlookupd_tcp_addresses: wrong type, expected an array of strings "
     "or a comma-separated string"),
    ("id = 2000", "invalid value 2000 for key id: must be in range [0,1023]"),
    ("max_msg_size = 9223372036854775808", "invalid value 9223372036854775808 for key max_msg_size: "
                                           "value out of range"),
    ("msg_timeout = 9223372036854775", "invalid value 9223372036854775 for key msg_timeout: value out of range"),
    ('log_level = "loud"',
     'invalid value "loud" for key log_level: invalid log level \'loud\' (debug, info, warn, error, fatal)'),
    ("e2e_processing_latency_percentiles = [2.0]",
     "invalid value [2.0] for key e2e_processing_latency_percentiles: each percentile must be in range (0,1]"),
    ("id = 1\nnode_id = 2", "keys id and node_id both set -node-id"),
]


@pytest.mark.parametrize("toml_text, message", FILE_ERRORS)
def test_invalid_config_file_values_name_the_key(tmp_path, toml_text, message, capsys):
    path = write(tmp_path, toml_text + "\n")
    with pytest.raises(SystemExit) as exited:
        parse_or_exit(NsqdOptions, ["-config", path], "nsqd")
    assert exited.value.code == 2
    assert capsys.readouterr().err == "config file %s: %s\n" % (path, message)


def test_config_file_syntax_error_is_one_line(tmp_path):
    path = write(tmp_path, "msg_timeout = \n")
    with pytest.raises(OptionsError) as caught:
        NsqdOptions.parse(["-config", path])
    assert str(caught.value).startswith("failed to load config file %s - " % path)
    assert "\n" not in str(caught.value)


def _usage_entries(text):
    """{flag line: its help unwrapped into one line} from -h's text."""
    entries, flag = {}, None
    for line in text.splitlines()[1:]:
        if line.startswith("  -"):
            flag = line.strip()
            entries[flag] = ""
        else:
            assert line.startswith("    \t"), line
            entries[flag] = (entries[flag] + " " + line[5:]).strip()
    return entries


@pytest.mark.parametrize("flag", ["-h", "-help", "--help", "--h"])
def test_help_prints_usage_and_exits_0(flag, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_or_exit(NsqdOptions, ["-msg-timeout=2s", flag, "-nope"], "nsqd")
    assert exited.value.code == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == "Usage of nsqd:"
    entries = _usage_entries(err)
    flags = [line.split()[0] for line in entries]
    assert flags == sorted("-" + spec.name for spec in NsqdOptions.specs() if not spec.hidden)
    assert max(len(line.expandtabs()) for line in lines) <= 80
    assert entries["-msg-timeout duration"] == "default time a client has before a message is requeued " \
        "automatically (default 1m0s)"
    assert entries["-deflate"] == "let clients negotiate deflate compression (default true)"
    assert entries["-tls-cert string"] == "path to the TLS certificate file"
    assert entries["-tcp-address string"] == "<addr>:<port> (or a unix socket path) for TCP clients [nsqpy: not " \
        "supported yet (unix socket listeners); nsqd refuses to start given a unix socket path] " \
        '(default "0.0.0.0:4150")'
    assert entries["-lookupd-tcp-address value"].startswith("nsqlookupd TCP address (repeatable) [nsqpy: registers "
                                                            "topics and channels within ~0.3 s of a change")
    assert entries["-workers int"].endswith("(default: the number of CPUs)")  # one default, said once
    assert all(text.count("(default") <= 1 for text in entries.values()), entries


def test_help_hides_test_only_flags_that_still_work():
    hidden = [spec for spec in NsqdOptions.specs() if spec.hidden]
    assert {spec.name for spec in hidden} == {"crash-on-body", "crash-on-forwarded-body"}
    usage = NsqdOptions.usage()
    assert not [spec.name for spec in hidden if f"-{spec.name} " in usage or f"-{spec.name}\n" in usage]
    assert NsqdOptions.parse(["--crash-on-body=boom"]).crash_on_body == "boom"


def test_help_for_other_daemons_uses_prog_name():
    with pytest.raises(HelpRequested) as caught:
        parse(NsqadminOptions, ["-h"], "my-admin")
    assert caught.value.usage.startswith("Usage of my-admin:\n")
    assert "  -base-path string\n" in caught.value.usage
    assert NsqlookupdOptions.usage().startswith("Usage of nsqlookupd:\n")


def test_version_is_just_a_field():
    assert NsqdOptions.parse(["--version"]).version is True
    assert NsqlookupdOptions.parse(["-version"]).version is True
