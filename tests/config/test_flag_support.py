"""No flag is a lie: every nsqd option either is used by the broker or is declared refused, unused or deprecated,
and ``check_support`` turns that into the start-up lines (nsqpy/config/support.py)."""
from __future__ import annotations

import pathlib
import re

import pytest

from nsqpy.config import NsqdOptions
from nsqpy.config.support import Deprecated, Differs, Refused, Unused, check_support

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPECS = {spec.name: spec for spec in NsqdOptions.specs()}

# NSQ options nsqpy implements (as their help says). A new NSQ option must be added here or declared with a
# ``support=`` in nsqpy/config/nsqd.py; nsqpy-only options count as implemented.
IMPLEMENTED = {
    "config", "version", "log-level", "log-prefix", "node-id", "max-msg-timeout", "msg-timeout", "max-msg-size",
    "max-req-timeout", "max-body-size", "max-heartbeat-interval", "max-rdy-count", "max-output-buffer-size",
    "max-output-buffer-timeout", "min-output-buffer-timeout", "output-buffer-timeout", "max-channel-consumers",
    "mem-queue-size", "statsd-address", "statsd-interval", "statsd-mem-stats", "statsd-prefix",
    "statsd-udp-packet-size", "statsd-exclude-ephemeral",
    "broadcast-address", "broadcast-tcp-port", "broadcast-http-port",  # registration with nsqlookupd
    "tls-cert", "tls-key", "tls-client-auth-policy", "tls-root-ca-file", "tls-required", "tls-min-version",
    "https-address", "auth-http-address", "auth-http-request-method", "snappy", "deflate", "max-deflate-level",
    "e2e-processing-latency-percentile", "e2e-processing-latency-window-time",  # workers/domain/e2e.py
}
REFUSED = set()  # nothing any more (the unix socket paths of --tcp-address and --http-address only)

# one command line per option that is accepted without effect: each sets that option away from its default
UNUSED_ARGV = {
    "verbose": ["--verbose"],
    "worker-id": ["--worker-id"],
    "topology-region": ["--topology-region=eu"],
    "topology-zone": ["--topology-zone=eu-1a"],
    "enable-experiment": ["--enable-experiment=topology-aware-consumption"],
    "queue-scan-worker-pool-max": ["--queue-scan-worker-pool-max=8"],
    "queue-scan-selection-count": ["--queue-scan-selection-count=40"],
}
DIFFERS = {"data-path", "max-bytes-per-file", "sync-every", "sync-timeout", "lookupd-tcp-address",
           "http-client-connect-timeout", "http-client-request-timeout"}

DEFAULT_NOTES = []


def report(*argv):
    return check_support(NsqdOptions.parse(list(argv)))


def test_every_nsq_option_is_classified_once():
    declared = {name for name, spec in SPECS.items() if spec.support is not None}
    nsqpy_only = {name for name, spec in SPECS.items() if spec.nsqpy_only}
    groups = [IMPLEMENTED, REFUSED | {"tcp-address", "http-address"}, set(UNUSED_ARGV), DIFFERS]
    assert sum(len(g) for g in groups) == len(set().union(*groups)), "an option is in two groups"
    assert set().union(*groups) | nsqpy_only == set(SPECS), "an option is in no group"
    assert declared == set(SPECS) - IMPLEMENTED - nsqpy_only, "IMPLEMENTED disagrees with the declarations"
    for name in REFUSED | {"tcp-address", "http-address"}:
        assert isinstance(SPECS[name].support, Refused), name
    for name in UNUSED_ARGV:
        assert isinstance(SPECS[name].support, (Unused, Deprecated)), name
    for name in DIFFERS:
        assert isinstance(SPECS[name].support, Differs), name


def _sources():
    files = [*ROOT.glob("workers/**/*.py"), *ROOT.glob("nsqpy/protocol/*.py"), ROOT / "nsqpy/config/nsqd.py",
             *ROOT.glob("http_api/**/*.py")]  # workers/ and http_api/ have sub-packages
    return "\n".join(path.read_text() for path in files)


def test_implemented_options_are_read_by_the_broker():
    """An option declared implemented (no ``support=``) is read somewhere outside its declaration: by the broker
    (workers/, the protocol code) or by NsqdOptions' own methods (``limits()``, ``data_directory()``)."""
    code = _sources()
    unread = []
    for name, spec in SPECS.items():
        if spec.support is not None and not isinstance(spec.support, Differs):
            continue
        if name == "config":  # read by the parser itself (nsqpy/config/options.py)
            continue
        if not re.search(r"(?<![\w])(opts|options|self)\.%s\b|getattr\(\w+(\.opts)?, \"%s\"" % (spec.attr, spec.attr),
                         code):
            unread.append(name)
    assert not unread, f"declared implemented but never read: {unread}"


def test_defaults_give_only_the_notes():
    r = report()
    assert (r.refusals, r.warnings) == ([], [])
    assert r.notes == DEFAULT_NOTES


@pytest.mark.parametrize("name", sorted(UNUSED_ARGV))
def test_an_unused_flag_set_away_from_its_default_is_one_warning(name):
    r = report(*UNUSED_ARGV[name])
    assert r.refusals == []
    assert len(r.warnings) == 1
    [line] = r.warnings
    assert line.startswith(f"flag --{name} is ")
    support = SPECS[name].support
    if isinstance(support, Deprecated):
        assert line == f"flag --{name} is deprecated and has no effect (as in NSQ); use {support.use}"
    else:
        assert line == f"flag --{name} is accepted for compatibility but not used yet: {support.what}"
        assert f"[nsqpy: not used yet: {support.what}]" in SPECS[name].help
    assert r.notes == DEFAULT_NOTES


def test_unused_flags_at_their_default_say_nothing():
    defaults = NsqdOptions()
    argv = []
    for name in UNUSED_ARGV:
        spec = SPECS[name]
        default = getattr(defaults, spec.attr)
        if isinstance(default, list):
            continue  # a repeatable flag given once is never its empty default
        shown = spec.kind.show(default)  # None: Go's help leaves a zero value out
        text = shown.strip('"') if shown is not None else str(default).lower() if isinstance(default, bool) else \
            "" if isinstance(default, str) else str(default)
        argv.append(f"--{name}={text}")
    assert len(argv) == len(UNUSED_ARGV) - 1  # enable-experiment
    r = report(*argv)
    assert (r.refusals, r.warnings, r.notes) == ([], [], DEFAULT_NOTES)


def test_disabling_the_http_listener_says_nothing():
    r = report("--http-address=")
    assert (r.refusals, r.warnings) == ([], [])
    assert r.notes == DEFAULT_NOTES


TLS = ["--tls-cert=/etc/nsqd/cert.pem", "--tls-key=/etc/nsqd/key.pem"]
REFUSALS = [
    (["--tcp-address=/run/nsqd.sock"],
     ["--tcp-address=/run/nsqd.sock is not supported yet: nsqpy has no unix socket listeners yet, so nsqd refuses "
      "to start"]),
    (["--http-address=/run/nsqd-http.sock"],
     ["--http-address=/run/nsqd-http.sock is not supported yet: nsqpy has no unix socket listeners yet, so nsqd "
      "refuses to start"]),
]


@pytest.mark.parametrize("argv, refusals", REFUSALS)
def test_security_flags_are_refused(argv, refusals):
    r = report(*argv)
    assert r.refusals == refusals
    assert r.warnings == []


@pytest.mark.parametrize("argv", [["--tls-min-version=tls1.0"], ["--tls-min-version="], ["--tls-required=false"],
                                  ["--tls-client-auth-policy="], ["--tcp-address=127.0.0.1:4150"],
                                  ["--tcp-address=[::1]:0"], TLS + ["--tls-client-auth-policy=require-verify"],
                                  ["--auth-http-address=127.0.0.1:4181", "--tls-root-ca-file=/etc/ca.pem"]])
def test_security_flags_at_their_default_are_not_refused(argv):
    r = report(*argv)
    assert (r.refusals, r.warnings) == ([], [])


def test_config_file_values_count_like_flags(tmp_path):
    path = tmp_path / "nsqd.toml"
    path.write_text('topology_zone = "eu-1a"\nauth_http_addresses = ["127.0.0.1:4181"]\n')
    r = report(f"--config={path}")
    assert r.refusals == []
    assert r.warnings == ["flag --topology-zone is accepted for compatibility but not used yet: topology-aware "
                          "consumption is not implemented"]


def test_help_says_what_each_declared_flag_does():
    for name, spec in SPECS.items():
        support = spec.support
        if isinstance(support, Refused):
            assert "nsqd refuses to start" in spec.help, name
        elif isinstance(support, Unused):
            assert "[nsqpy: not used yet: " in spec.help, name
        elif isinstance(support, Differs):
            assert f"[nsqpy: {support.what}]" in spec.help, name
        elif isinstance(support, Deprecated):
            assert spec.help.startswith("[deprecated] no effect; use " + support.use), name
    # a count of messages as NSQ's, decided per log segment, with a cap in bytes: the help says both
    assert "messages" in SPECS["mem-queue-size"].help and "x 1 KiB" in SPECS["mem-queue-size"].help
