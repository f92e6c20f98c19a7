"""NsqdOptions: every nsqd flag of NSQ v1.3.0 (plus the few master-only ones the
spec lists), with NSQ's names, defaults and start-up checks, and nsqpy's own
options after them.  Durations are int nanoseconds (Go's time.Duration).

``limits()`` is the one derivation of nsqd's limits from the options: a
``nsqpy.protocol.limits.Limits`` (sizes, counts, durations in whole ms,
truncated as Go's ``d / time.Millisecond``) that the V2 parser, IDENTIFY
(``server_settings()``), the workers and the HTTP API all read.  The limit
flags take their defaults from that module's ``NSQ_DEFAULTS``, the one copy.
"""
from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

from .common import DaemonOptions, TLSRequired, TLSVersion, default_node_id, hostname
from nsqpy.protocol.identify import ServerSettings
from nsqpy.protocol.limits import NSQ_DEFAULTS as NSQ, Limits, to_ms
from nsqpy.protocol.names import is_valid_name

from .duration import MILLISECOND, MINUTE, SECOND
from .kinds import Bool, Choice, Duration, Int, Percentiles, Str, StrList, TLSRequiredKind
from .options import option, require
from .support import Deprecated, Differs, Refused, Unused

TLS_REQUIRED = TLSRequiredKind(
    {"false": TLSRequired.NOT_REQUIRED, "true": TLSRequired.REQUIRED, "tcp-https": TLSRequired.EXCEPT_HTTP}, "")
TLS_MIN_VERSION = Choice(
    # "" keeps the default, as nsqd's flag does; ssl3.0 is named in nsqd's help but refused.
    {"": TLSVersion.TLS1_0, "tls1.0": TLSVersion.TLS1_0, "tls1.1": TLSVersion.TLS1_1,
     "tls1.2": TLSVersion.TLS1_2, "tls1.3": TLSVersion.TLS1_3},
    "unknown tlsVersionOption {quoted}",
)
TLS_CLIENT_AUTH_POLICY = Choice(
    {"": "", "require": "require", "require-verify": "require-verify"},
    'must be "", "require" or "require-verify"',
)
# The overflow policies of workers/domain/policy.py's OVERFLOWS (that module is a floor above: a test holds the two
# lists equal).
CHANNEL_OVERFLOW = Choice({"block": "block", "reject": "reject", "drop_oldest": "drop_oldest"},
                          "must be block, reject or drop_oldest")
AUTH_HTTP_REQUEST_METHOD = Choice({"get": "get", "post": "post"}, "must be 'post' or 'get'")

# What nsqpy does not do yet (nsqpy.config.support): refused security features, options without effect.
NO_PRECREATE = Differs("registers topics and channels within ~0.3 s of a change, not at once; a new topic gets "
                       "the channels lookupd knows for it just as late, so messages published in that window go "
                       "to the first of them only")
NO_LOOKUPD_HTTP = Differs("used for the auth servers' requests (one timeout: the larger of the two)")
NO_TOPOLOGY = Unused("topology-aware consumption is not implemented")
SYNC = Differs("applies to durable topics (--mem-queue-size=0: messages and control blocks in files), as group "
               "commit: at most one fdatasync per file and loop iteration; other topics keep messages in memory "
               "(and in unsynced spill files) until a stop saves them")
NO_SAMPLING = Unused("in-flight timeouts and deferred messages wait in heaps and each fires when due, "
                     "without sampling channels")


@dataclasses.dataclass
class NsqdOptions(DaemonOptions):
    PROG: ClassVar[str] = "nsqd"
    # nsqd internals with no flag (nsqd/options.go): fixed, but kept here with the rest (ClientTimeout, read by
    # IDENTIFY, is nsqpy.protocol.limits.Limits.client_timeout_ms).
    QUEUE_SCAN_INTERVAL: ClassVar[int] = 100 * MILLISECOND
    QUEUE_SCAN_REFRESH_INTERVAL: ClassVar[int] = 5 * SECOND
    QUEUE_SCAN_DIRTY_PERCENT: ClassVar[float] = 0.25

    log_prefix: str = option(Str(), "[nsqd] ", "prefix for every log line")
    node_id: int = option(Int(0, 1023), None, "unique part of message IDs, in [0,1024) "
                          "(default: a hash of the hostname)", factory=default_node_id, cfg="id")
    worker_id: bool = option(Bool(), False, "[deprecated] no effect; use --node-id", from_file=False, reported=False,
                             support=Deprecated("--node-id"))

    tcp_address: str = option(Str(), "0.0.0.0:4150", "<addr>:<port> (or a unix socket path) for TCP clients",
                              support=Refused("unix socket listeners", applies=lambda address: ":" not in address,
                                              when="given a unix socket path"))
    http_address: str = option(Str(), "0.0.0.0:4151", "<addr>:<port> (or a unix socket path) for HTTP clients; "
                               "empty to disable",
                               support=Refused("unix socket listeners",
                                               applies=lambda address: address != "" and ":" not in address,
                                               when="given a unix socket path"))
    https_address: str = option(Str(), "0.0.0.0:4152", "<addr>:<port> for HTTPS clients (used only with "
                                "--tls-cert and --tls-key)")
    broadcast_address: str = option(Str(), None, "address registered with nsqlookupd (default: the OS hostname)",
                                     factory=hostname)
    broadcast_tcp_port: int = option(Int(), 0, "TCP port registered with nsqlookupd (0: the port listened on)")
    broadcast_http_port: int = option(Int(), 0, "HTTP port registered with nsqlookupd (0: the port listened on)")
    lookupd_tcp_address: list[str] = option(StrList(), [], "nsqlookupd TCP address (repeatable)",
                                            cfg="nsqlookupd_tcp_addresses", support=NO_PRECREATE)
    auth_http_address: list[str] = option(StrList(), [], "auth server as <addr>:<port> or a full URL "
                                          "(repeatable)", cfg="auth_http_addresses")
    auth_http_request_method: str = option(AUTH_HTTP_REQUEST_METHOD, "get", "HTTP method for auth requests: "
                                           "get or post")
    http_client_connect_timeout: int = option(Duration(), 2 * SECOND, "connect timeout for requests to "
                                              "nsqlookupd and auth servers", support=NO_LOOKUPD_HTTP)
    http_client_request_timeout: int = option(Duration(), 5 * SECOND, "whole-request timeout for requests to "
                                              "nsqlookupd and auth servers", support=NO_LOOKUPD_HTTP)
    topology_region: str = option(Str(), "", "region of this node, for topology-aware consumption",
                                  support=NO_TOPOLOGY)
    topology_zone: str = option(Str(), "", "zone of this node, for topology-aware consumption",
                                support=NO_TOPOLOGY)
    enable_experiment: list[str] = option(StrList(), [], "turn on an experimental feature, e.g. "
                                          "topology-aware-consumption (repeatable)",
                                          support=Unused("no experimental feature is implemented"))

    data_path: str = option(Str(), "", "directory for nsqd.dat and the disk queues (default: the working "
                            "directory)", support=Differs(
                                "also holds the disk tier of the topics' logs, the workers' topic journals and "
                                "set-aside messages (quarantine/); the disk queues (NSQ's format) are written at a "
                                "clean stop and after a crash, and read at start"))
    mem_queue_size: int = option(Int(), 10000, "messages of each topic kept in memory (as NSQ; its channels "
                                 "share the topic's one log): a new 8 MiB log segment (bigger if --max-msg-size "
                                 "needs it) goes to shared memory only while the slowest channel has fewer than "
                                 "this many messages waiting, else to files under --data-path (#ephemeral topics "
                                 "drop what does not fit, as in NSQ), so memory holds up to one segment more; "
                                 "memory is also capped at this x 1 KiB per topic (at least two segments). 0: "
                                 "every message on disk with the topic's control block, synced by --sync-every "
                                 "and --sync-timeout, and recovered after a reboot")
    max_bytes_per_file: int = option(Int(), 104857600, "bytes per disk-queue file before it rolls",
                                     support=Differs("used by the disk queues written at a stop; while running, "
                                                     "a topic's disk tier is log segments of 8 MiB (or the power "
                                                     "of two that holds a --max-msg-size message), bounded by "
                                                     "--max-disk-bytes-per-topic"))
    sync_every: int = option(Int(), 2500, "messages written to a disk queue between fsyncs", support=SYNC)
    sync_timeout: int = option(Duration(), 2 * SECOND, "longest time between disk-queue fsyncs", support=SYNC)
    queue_scan_worker_pool_max: int = option(Int(), 4, "most workers scanning in-flight and deferred "
                                             "timeouts at once", support=NO_SAMPLING)
    queue_scan_selection_count: int = option(Int(), 20, "channels sampled per scan (every 100ms) for "
                                             "in-flight and deferred timeouts", support=NO_SAMPLING)

    # The limits' defaults are NSQ's, from nsqpy.protocol.limits (one copy, also IDENTIFY's and the parser's).
    msg_timeout: int = option(Duration(), NSQ.msg_timeout_ms * MILLISECOND, "default time a client has before a "
                              "message is requeued automatically")
    max_msg_timeout: int = option(Duration(), NSQ.max_msg_timeout_ms * MILLISECOND, "longest message timeout a "
                                  "client may ask for")
    max_msg_size: int = option(Int(), NSQ.max_msg_size, "largest message body, in bytes")
    max_req_timeout: int = option(Duration(), NSQ.max_req_timeout_ms * MILLISECOND, "longest requeue delay (REQ) "
                                  "and deferral (DPUB, /pub?defer)")
    max_body_size: int = option(Int(), NSQ.max_body_size, "largest command body (IDENTIFY, AUTH, MPUB), in bytes")
    max_heartbeat_interval: int = option(Duration(), NSQ.max_heartbeat_interval_ms * MILLISECOND, "longest "
                                         "heartbeat interval a client may ask for")
    max_rdy_count: int = option(Int(), NSQ.max_rdy_count, "largest RDY count a client may set")
    max_output_buffer_size: int = option(Int(), NSQ.max_output_buffer_size, "largest output buffer a client may "
                                         "ask for, in bytes")
    max_output_buffer_timeout: int = option(Duration(), NSQ.max_output_buffer_timeout_ms * MILLISECOND, "longest "
                                            "output flush interval a client may ask for")
    min_output_buffer_timeout: int = option(Duration(), NSQ.min_output_buffer_timeout_ms * MILLISECOND, "shortest "
                                            "output flush interval a client may ask for")
    output_buffer_timeout: int = option(Duration(), NSQ.output_buffer_timeout_ms * MILLISECOND, "default output "
                                        "flush interval (nsqpy negotiates and reports it, and flushes sooner: after "
                                        "every loop iteration)")
    max_channel_consumers: int = option(Int(), NSQ.max_channel_consumers, "most consumer connections per channel "
                                        "(0: no limit)")

    statsd_address: str = option(Str(), "", "UDP <addr>:<port> of a statsd daemon to push stats to")
    statsd_interval: int = option(Duration(), 60 * SECOND, "time between statsd pushes")
    statsd_mem_stats: bool = option(Bool(), True, "include memory and GC stats in statsd pushes")
    statsd_prefix: str = option(Str(), "nsq.%s", "prefix of statsd keys (%s becomes the host and port)")
    statsd_udp_packet_size: int = option(Int(), 508, "size of statsd UDP packets, in bytes")
    statsd_exclude_ephemeral: bool = option(Bool(), False, "leave #ephemeral topics and channels out of "
                                            "statsd")
    e2e_processing_latency_percentile: list[float] = option(
        Percentiles(), [], "message processing time (publication to FIN) percentile to report per channel and "
        "topic in /stats and statsd, in (0,1] (repeatable or comma-separated, e.g. 1.0,0.99,0.95)",
        cfg="e2e_processing_latency_percentiles")
    e2e_processing_latency_window_time: int = option(Duration(), 10 * MINUTE, "time window the latency "
                                                     "percentiles cover (two halves that rotate: what is shown "
                                                     "covers the last half window to whole window)")

    tls_cert: str = option(Str(), "", "path to the TLS certificate file")
    tls_key: str = option(Str(), "", "path to the TLS key file")
    tls_client_auth_policy: str = option(TLS_CLIENT_AUTH_POLICY, "", "client certificate policy: require or "
                                         "require-verify (either implies --tls-required)")
    tls_root_ca_file: str = option(Str(), "", "path to the CA file used to verify client certificates and "
                                   "auth servers")
    tls_required: TLSRequired = option(TLS_REQUIRED, TLSRequired.NOT_REQUIRED, "require TLS from clients: "
                                       "true, false or tcp-https (TCP only)")
    tls_min_version: TLSVersion = option(TLS_MIN_VERSION, TLSVersion.TLS1_0, "lowest TLS version accepted: "
                                         "tls1.0, tls1.1, tls1.2 or tls1.3")
    deflate: bool = option(Bool(), True, "let clients negotiate deflate compression")
    max_deflate_level: int = option(Int(1, 9), NSQ.max_deflate_level, "highest deflate level a client may "
                                    "negotiate (1-9)")
    snappy: bool = option(Bool(), True, "let clients negotiate snappy compression")

    # nsqpy's own options: not in NSQ; each help says so.
    workers: int = option(Int(1), None, "nsqpy only: number of broker worker processes sharing the "
                          "listeners (default: the number of CPUs)", factory=lambda: os.cpu_count() or 1,
                          nsqpy_only=True)
    max_disk_bytes_per_topic: int = option(Int(1 << 20), 16 << 30, "nsqpy only: bytes a topic may keep on disk "
                                           "beyond its memory queue before PUB fails (each topic reserves twice "
                                           "this much address space, not memory)", nsqpy_only=True)
    crash_on_body: str = option(Str(), "", "nsqpy only: for fault-injection tests, a worker kills itself with "
                                "SIGSEGV when it frames a message whose body starts with this text (never set "
                                "it in production)", nsqpy_only=True, hidden=True)
    crash_on_forwarded_body: str = option(Str(), "", "nsqpy only: for fault-injection tests, a topic's owner kills "
                                          "itself with SIGSEGV when it appends a publish forwarded by another "
                                          "worker holding a message whose body starts with this text (never set it "
                                          "in production)", nsqpy_only=True, hidden=True)
    ring_budget: int = option(Int(1 << 20), 1 << 30, "nsqpy only: bytes of /dev/shm that the rings carrying "
                              "publishes and commands to topic owners may take when all of them are full: each "
                              "of the (workers + external-producers) x workers - workers rings gets an equal share, "
                              "rounded down to a power of two between 256 KiB and 32 MiB (so with many workers the "
                              "256 KiB floor can exceed the budget: nsqd says so at start); a ring's pages are "
                              "reserved only once it holds that much, and publishes bigger than an eighth of a ring "
                              "are handed over by file", nsqpy_only=True)
    external_producers: int = option(Int(0, 1024), 8, "nsqpy only: producer slots for processes other than the "
                                     "workers that publish or send commands to topic owners (HTTP API workers, "
                                     "the nsqlookupd registrar); each slot adds one ring to every worker, which "
                                     "takes /dev/shm only once used", nsqpy_only=True)
    max_in_flight_per_worker: int = option(Int(1, 1 << 24), 1 << 17, "nsqpy only: most messages a worker holds "
                                           "in flight or requeued at once (its in-flight table's slots); past "
                                           "that its channels wait until slots are freed. Slots take /dev/shm "
                                           "(~170 bytes each with their timer) only once used", nsqpy_only=True)
    http_workers: int = option(Int(1, 64), 2, "nsqpy only: gunicorn worker processes serving the HTTP API (at "
                               "most --external-producers - 1: each takes one producer slot)", nsqpy_only=True)
    http_worker_class: str = option(Choice({"sync": "sync", "gthread": "gthread", "asgi": "asgi"},
                                           "must be sync, gthread or asgi"), "asgi",
                                    "nsqpy only: gunicorn worker class of the HTTP API: asgi (the fastest, "
                                    "benchmarks/results/http_bench.json; an event loop per worker, so clients "
                                    "that send requests slowly hold no worker, and a request's headers must "
                                    "arrive within 10 s), sync or gthread (8 threads each); sync and gthread are "
                                    "exposed to slow clients: one holds a sync worker until gunicorn's 60 s "
                                    "timeout restarts it, and 20 left gthread answering 5 of 7 requests",
                                    nsqpy_only=True)
    producer_placement: str = option(Choice({"auto": "auto", "spread": "spread", "owner": "owner"},
                                            "must be auto, spread or owner"),
                                     "auto",
                                     "nsqpy only: where a producer that sends one message per round trip (PUB, "
                                     "or MPUB of one) is served. spread: where the acceptor put it; a publish to "
                                     "a topic of another worker is forwarded through a ring and the owner "
                                     "appends runs of them with one call, so the socket calls of a hot topic use "
                                     "every worker. owner: once its last 64 went to topics of one other worker, "
                                     "it moves there (least CPU per message, but that worker alone does the "
                                     "socket calls of all its producers). auto: as spread, but a producer whose "
                                     "usual window of 64 to one other worker (its fastest of about the last "
                                     "second) came at most --producer-move-in-rate a second, watched for at "
                                     "least half a second, moves there while that worker is mostly "
                                     "idle, not busy (--producer-busy-percent) and has fewer than 4 producers "
                                     "moved to it (its messages skip a process hop: lower latency), and moves out "
                                     "again above --producer-move-out-rate, at any rate while that worker is busy "
                                     "and serves others moved there, or when its round trips there are 1.25 "
                                     "times as slow as before the move (then it never moves in again). "
                                     "Measurements and the cost model: "
                                     "ARCHITECTURE.md", nsqpy_only=True)
    producer_move_in_rate: int = option(Int(1, 1 << 30), 20000, "nsqpy only: with --producer-placement=auto, the "
                                        "most one-message commands a second at which a producer moves to its "
                                        "topics' owner", nsqpy_only=True)
    producer_move_out_rate: int = option(Int(1, 1 << 30), 40000, "nsqpy only: with --producer-placement=auto, a "
                                         "producer moved to its topics' owner moves to the least loaded other "
                                         "worker above this many one-message commands a second (more than "
                                         "--producer-move-in-rate)", nsqpy_only=True)
    producer_busy_percent: int = option(Int(0, 100), 80, "nsqpy only: with --producer-placement=auto, while a "
                                        "topic owner's process used more than this share of a core (CPU time "
                                        "over wall time) in the last second, no producer moves to it, and those "
                                        "moved there move to the least loaded other worker, however slow, all "
                                        "but the last. With more workers than cores a worker may never reach "
                                        "80: set it lower there", nsqpy_only=True)
    # Delivery policies (issue 49; workers/domain/policy.py): the defaults of every topic and channel, each
    # overridden per topic or channel by POST /topic/config and /channel/config. All off by default.
    max_attempts: int = option(Int(0, 65535), 0, "nsqpy only: default of every channel's max_attempts: a "
                               "message delivered this many times that is then REQ'd or times out goes to the "
                               "topic's dead-letter topic (see --dead-letter-topic-suffix) instead of being "
                               "delivered again, counted as dead_lettered_count (0: off, as NSQ)",
                               nsqpy_only=True)
    dead_letter_topic_suffix: str = option(Str(), ".dead", "nsqpy only: a topic's dead-letter topic, unless one "
                                           "is configured for it, is its name + this suffix; the flags' "
                                           "defaults do not apply to topics whose name ends with it",
                                           nsqpy_only=True)
    message_ttl: int = option(Duration(), 0, "nsqpy only: default message TTL (whole ms): a message older than "
                              "this since its publish is never delivered again; it goes to the dead-letter topic "
                              "when one is in effect, else it is dropped and counted as expired_count (0: off)",
                              nsqpy_only=True)
    max_channel_depth: int = option(Int(0), 0, "nsqpy only: default most messages waiting in a channel (memory "
                                    "and disk together); --channel-overflow says what a publish past it does "
                                    "(0: no bound)", nsqpy_only=True)
    max_channel_bytes: int = option(Int(0), 0, "nsqpy only: default most bytes of messages waiting in a channel "
                                    "(memory and disk together); --channel-overflow says what a publish past it "
                                    "does (0: no bound)", nsqpy_only=True)
    channel_overflow: str = option(CHANNEL_OVERFLOW, "block", "nsqpy only: what a publish to a channel at its "
                                   "max depth or bytes does: block (TCP back-pressure on its producers; HTTP "
                                   "waits a bounded time, then 503), reject (E_PUB_FAILED / HTTP 503 "
                                   "CHANNEL_FULL) or drop_oldest (the channel's oldest waiting message is "
                                   "dropped, counted as dropped_count)", nsqpy_only=True)
    compile_only: bool = option(Bool(), False, "nsqpy only: compile the broker's numba kernels into their cache "
                                "(or find them there) and exit without starting; run it after an install or upgrade, "
                                "before the service restarts, so that the restart loads them instead of compiling "
                                "them", from_file=False, reported=False, nsqpy_only=True)
    leftovers: bool = option(Bool(), False, "nsqpy only: list the shared memory that dead nsqd instances left in "
                             "/dev/shm (each instance's name, size and the --data-path and --node-id whose next "
                             "start recovers its messages) and exit", from_file=False, reported=False,
                             nsqpy_only=True)
    discard_leftovers: str = option(Str(), "", "nsqpy only: remove the shared memory a dead nsqd instance left "
                                    "(its name as --leftovers lists it) and exit; the messages it held are lost",
                                    from_file=False, reported=False, nsqpy_only=True)

    def settle(self) -> None:
        # nsqd: any client-certificate policy turns TLS on for clients.
        if self.tls_client_auth_policy and self.tls_required == TLSRequired.NOT_REQUIRED:
            self.tls_required = TLSRequired.REQUIRED
        require(bool(self.tls_cert) == bool(self.tls_key), "-tls-cert and -tls-key must be given together")
        require(self.producer_move_in_rate < self.producer_move_out_rate,
                "--producer-move-in-rate must be less than --producer-move-out-rate")
        require(self.message_ttl == 0 or self.message_ttl >= MILLISECOND,
                "--message-ttl must be 0 (off) or at least 1ms (policies count whole milliseconds)")
        require(self.dead_letter_topic_suffix != "" and is_valid_name("t" + self.dead_letter_topic_suffix)
                and not self.dead_letter_topic_suffix.endswith(
            "#ephemeral"), "--dead-letter-topic-suffix must be a non-empty suffix of a valid topic name "
            "(letters, digits, '.', '_', '-')")
        require(self.tls_required == TLSRequired.NOT_REQUIRED or bool(self.tls_cert),
                "cannot require TLS client connections (-tls-required, -tls-client-auth-policy) "
                "without -tls-cert and -tls-key")

    def data_directory(self) -> str:
        """--data-path, with "" meaning the working directory as in nsqd."""
        return self.data_path or os.getcwd()

    def limits(self) -> Limits:
        """nsqd's limits from these options: the one derivation (each duration to whole ms, once, here)."""
        return Limits(
            max_msg_size=self.max_msg_size,
            max_body_size=self.max_body_size,
            max_rdy_count=self.max_rdy_count,
            max_req_timeout_ms=to_ms(self.max_req_timeout),
            max_msg_timeout_ms=to_ms(self.max_msg_timeout),
            msg_timeout_ms=to_ms(self.msg_timeout),
            max_heartbeat_interval_ms=to_ms(self.max_heartbeat_interval),
            max_output_buffer_size=self.max_output_buffer_size,
            min_output_buffer_timeout_ms=to_ms(self.min_output_buffer_timeout),
            max_output_buffer_timeout_ms=to_ms(self.max_output_buffer_timeout),
            output_buffer_timeout_ms=to_ms(self.output_buffer_timeout),
            max_deflate_level=self.max_deflate_level,
            max_channel_consumers=self.max_channel_consumers,
        )

    def server_settings(self, limits: Limits | None = None) -> ServerSettings:
        """What IDENTIFY needs: ``limits`` (default: ``self.limits()``) and the features these options turn on."""
        return ServerSettings(
            limits=self.limits() if limits is None else limits,
            tls_available=bool(self.tls_cert), snappy_enabled=self.snappy, deflate_enabled=self.deflate,
            auth_required=bool(self.auth_http_address),
            tls_required=self.tls_required != TLSRequired.NOT_REQUIRED)  # tcp-https: TCP requires it too
