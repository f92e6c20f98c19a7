"""NsqadminOptions: the nsqadmin flags of NSQ v1.3.0, with its defaults and start-up checks."""
from __future__ import annotations

import dataclasses
import ipaddress
from typing import ClassVar

from .common import DaemonOptions
from .duration import SECOND
from .kinds import Bool, Duration, Str, StrList
from .options import option, require
from .support import Unused


def _check_cidr(text: str) -> None:
    """nsqadmin refuses to start on a --allow-config-from-cidr net.ParseCIDR rejects."""
    if "/" not in text:
        raise ValueError("invalid CIDR address: " + text)
    try:
        ipaddress.ip_network(text, strict=False)  # like Go, host bits may be set: 127.0.0.1/8
    except ValueError:
        raise ValueError("invalid CIDR address: " + text) from None


@dataclasses.dataclass
class NsqadminOptions(DaemonOptions):
    PROG: ClassVar[str] = "nsqadmin"

    log_prefix: str = option(Str(), "[nsqadmin] ", "prefix for every log line")
    http_address: str = option(Str(), "0.0.0.0:4171", "<addr>:<port> for HTTP clients")
    base_path: str = option(Str(), "/", "URL path prefix of every page and API route")
    graphite_url: str = option(Str(), "", "graphite HTTP address; with it the topics page shows each "
                                         "topic's rate (/api/graphite) (empty: off)")
    proxy_graphite: bool = option(Bool(), False, "serve GET /render by passing it on to --graphite-url")
    statsd_counter_format: str = option(Str(), "stats.counters.%s.count", "how the statsd server formats "
                                        "counter keys, for the rate column's graphite series (empty: "
                                        "unformatted)")
    statsd_gauge_format: str = option(Str(), "stats.gauges.%s", "how the statsd server formats gauge keys "
                                      "(empty: unformatted)",
                                      support=Unused("the UI asks graphite for counters only (the rate column); "
                                                     "its own charts replace Go's graphite graphs"))
    statsd_prefix: str = option(Str(), "nsq.%s", "statsd key prefix nsqd uses (%s for the host; must match "
                                "nsqd)")
    statsd_interval: int = option(Duration(), 60 * SECOND, "statsd push interval nsqd uses (must match nsqd)")
    notification_http_endpoint: str = option(Str(), "", "full URL that admin actions are POSTed to")
    http_client_connect_timeout: int = option(Duration(), 2 * SECOND, "connect timeout for requests to "
                                              "nsqd and nsqlookupd")
    http_client_request_timeout: int = option(Duration(), 5 * SECOND, "whole-request timeout for requests "
                                              "to nsqd and nsqlookupd")
    http_client_tls_insecure_skip_verify: bool = option(Bool(), False, "do not verify TLS certificates of "
                                                        "nsqd and nsqlookupd")
    http_client_tls_root_ca_file: str = option(Str(), "", "CA file for verifying nsqd and nsqlookupd")
    http_client_tls_cert: str = option(Str(), "", "client certificate file for HTTPS requests")
    http_client_tls_key: str = option(Str(), "", "client key file for HTTPS requests")
    allow_config_from_cidr: str = option(Str(_check_cidr), "127.0.0.1/8", "network allowed to use the /config "
                                         "endpoint")
    acl_http_header: str = option(Str(), "X-Forwarded-User", "HTTP header naming the authenticated user")
    admin_user: list[str] = option(StrList(), [], "user allowed to make changes (repeatable; none: everyone)",
                                   cfg="admin_users")
    lookupd_http_address: list[str] = option(StrList(), [], "nsqlookupd HTTP address (repeatable)",
                                             cfg="nsqlookupd_http_addresses")
    nsqd_http_address: list[str] = option(StrList(), [], "nsqd HTTP address (repeatable)",
                                          cfg="nsqd_http_addresses")
    dev_static_dir: str = option(Str(), "", "serve static files from this directory (development)")

    def settle(self) -> None:
        if self.version:
            return  # Go prints the version before checking anything else
        lookupd, nsqd = bool(self.lookupd_http_address), bool(self.nsqd_http_address)
        require(lookupd or nsqd, "--nsqd-http-address or --lookupd-http-address required")
        require(not (lookupd and nsqd), "use --nsqd-http-address or --lookupd-http-address not both")
        require(bool(self.http_client_tls_cert) == bool(self.http_client_tls_key),
                "-http-client-tls-cert and -http-client-tls-key must be given together")
