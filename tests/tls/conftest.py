"""Brokers with TLS (trustme certificates), compression and an auth server, for the tests of issue 13."""
from __future__ import annotations

import ssl

import pytest
import trustme

from tests.broker.conftest import module_nsqd_factory, nsqd_factory  # noqa: F401 (fixtures)


@pytest.fixture(scope="session")
def ca():
    return trustme.CA()


@pytest.fixture(scope="session")
def certs(ca, tmp_path_factory):
    """Server certificate files and a CA file that verifies it (and the client certificates)."""
    d = tmp_path_factory.mktemp("certs")
    server = ca.issue_cert("localhost", "127.0.0.1")
    server.cert_chain_pems[0].write_to_path(d / "cert.pem")
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(d / "cert.pem", append=True)
    server.private_key_pem.write_to_path(d / "key.pem")
    ca.cert_pem.write_to_path(d / "ca.pem")
    return {"cert": str(d / "cert.pem"), "key": str(d / "key.pem"), "ca": str(d / "ca.pem"),
            # --https-address: with a certificate nsqd listens on 0.0.0.0:4152 by default; tests use port 0
            "flags": [f"--tls-cert={d / 'cert.pem'}", f"--tls-key={d / 'key.pem'}", "--https-address=127.0.0.1:0"]}


@pytest.fixture(scope="session")
def client_tls(ca):
    """A client SSLContext that trusts the test CA (no client certificate)."""
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx
