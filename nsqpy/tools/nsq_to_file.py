"""nsq_to_file: archive topics into rolling files, one line per message.

Messages are answered (FIN) only once the file holding them was synced to disk: a handler writes and holds its
message; every `--sync-interval`, or as soon as `--max-in-flight` messages are held (nsqd would send no more),
the files are synced and the held messages FINed. On SIGINT/SIGTERM the consumers stop gracefully, what is held
is synced and FINed, and the files are closed (and moved from --work-dir to --output-dir).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading

from nsqpy.client import Consumer
from nsqpy.client.lookupd import http_get_json
from nsqpy.tools.common import (add_consumer_flags, add_http_timeouts, check_names, check_nsqds, consumer_options,
                                duration, entry_point, fail, normalize_argv, parser, setup_logging)
from nsqpy.tools.file_logger import FileLogger


class Archiver:
    def __init__(self, opts):
        self.opts = opts
        self.starved = lambda topic: False   # set by main: the topic's consumer holds ~all the RDY it has
        self.loggers: dict[str, FileLogger] = {}
        self.held = []
        self.lock = threading.Lock()
        self.closing = False
        self.count = 0

    def handler_for(self, topic: str):
        logger = self.loggers.setdefault(topic, FileLogger(topic, self.opts))

        def handle(message):
            message.disable_auto_response()
            with self.lock:
                logger.write(message.body)
                self.count += 1
                self.held.append(message)
                # nsqd sends no more once the held messages fill a connection's RDY: sync and FIN now
                # rather than at the next --sync-interval (go-nsq's IsStarved, as NSQ's nsq_to_file)
                if self.closing or len(self.held) >= self.opts.max_in_flight or self.starved(topic):
                    self._sync_locked()
        return handle

    def sync(self) -> None:
        with self.lock:
            self._sync_locked()

    def _sync_locked(self) -> None:
        for logger in self.loggers.values():
            logger.sync()
        held, self.held = self.held, []
        for message in held:
            message.fin()

    def close(self) -> None:
        with self.lock:
            self._sync_locked()
            for logger in self.loggers.values():
                logger.close()


def topics_matching(lookupds, pattern, timeout: float) -> set[str]:
    found = set()
    for address in lookupds:
        url = (address if "://" in address else "http://" + address).rstrip("/") + "/topics"
        try:
            found.update(t for t in http_get_json(url, timeout).get("topics", []) if re.search(pattern, t))
        except Exception as err:
            print(f"[nsq_to_file] lookupd {address}: {err}", file=sys.stderr)
    return found


@entry_point("nsq_to_file")
def main(argv=None) -> int:
    p = parser("nsq_to_file", __doc__)
    add_consumer_flags(p, channel_default="nsq_to_file")
    p.add_argument("--topic-pattern", default="", help="only log topics matching this regex (needs lookupd)")
    p.add_argument("--topic-refresh", type=duration, default=60.0, help="how often the topic list is refreshed")
    p.add_argument("--output-dir", default="/tmp", help="directory to write output files to")
    p.add_argument("--work-dir", default="", help="directory for files being written (default: --output-dir)")
    p.add_argument("--filename-format", default="<TOPIC>.<HOST><REV>.<DATETIME>.log",
                   help="output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV>)")
    p.add_argument("--datetime-format", default="%Y-%m-%d_%H", help="strftime format for <DATETIME>")
    p.add_argument("--host-identifier", default="", help="value for <HOST> (<SHORT_HOST>, <HOSTNAME> expand)")
    p.add_argument("--utc", action=argparse.BooleanOptionalAction, default=False,
                   help="<DATETIME> in UTC (default: local time, as NSQ)")
    p.add_argument("--gzip", action="store_true", help="gzip output files")
    p.add_argument("--gzip-level", type=int, default=6, help="gzip compression level (1-9)")
    p.add_argument("--rotate-size", type=int, default=0, help="rotate the file when it grows past this many "
                   "bytes (0: never)")
    p.add_argument("--rotate-interval", type=duration, default=0.0, help="rotate the file every duration "
                   "(0: never)")
    p.add_argument("--sync-interval", type=duration, default=30.0, help="sync file to disk every duration")
    p.add_argument("--skip-empty-files", action="store_true", help="skip writing empty files (files are "
                   "always opened on their first message here)")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error")
    p.add_argument("--log-prefix", default="[nsq_to_file] ", help="prefix of the closing summary line")
    add_http_timeouts(p, request=5.0)
    args = p.parse_args(normalize_argv(sys.argv[1:] if argv is None else argv))
    setup_logging(args.log_level)
    if bool(args.nsqd_tcp_address) == bool(args.lookupd_http_address):
        fail(p, "use --nsqd-tcp-address or --lookupd-http-address, not both (and one is required)")
    if args.topic_pattern and not args.lookupd_http_address:
        fail(p, "--topic-pattern needs --lookupd-http-address")
    if bool(args.topic) == bool(args.topic_pattern):
        fail(p, "give --topic or --topic-pattern")
    if not 1 <= args.gzip_level <= 9:
        fail(p, "--gzip-level must be 1-9")
    check_names(args)
    options = consumer_options(p, args)
    check_nsqds(args, options)
    archiver = Archiver(args)
    stop = threading.Event()
    consumers: dict[str, Consumer] = {}
    archiver.starved = lambda topic: topic in consumers and consumers[topic].async_consumer.is_starved()

    def add(topic):
        c = Consumer(topic, args.channel, archiver.handler_for(topic), nsqd_tcp_addresses=args.nsqd_tcp_address,
                     lookupd_http_addresses=args.lookupd_http_address, **options)
        consumers[topic] = c.start()

    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    next_refresh = 0.0
    try:
        for topic in args.topic:
            add(topic)
        waited = 0.0
        while not stop.wait(0.2):   # 0.2 s ticks: signals run promptly, sync and refresh run on time
            waited += 0.2
            if waited >= args.sync_interval:
                archiver.sync()
                waited = 0.0
            if args.topic_pattern:
                next_refresh -= 0.2
                if next_refresh <= 0:
                    next_refresh = args.topic_refresh
                    for topic in topics_matching(args.lookupd_http_address, args.topic_pattern,
                                                 args.http_client_request_timeout) - set(consumers):
                        add(topic)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with archiver.lock:
            archiver.closing = True   # from now on each message is synced and FINed at once: stop() drains
            archiver._sync_locked()
        for c in consumers.values():
            c.stop()
        archiver.close()
    print(f"{args.log_prefix}wrote {archiver.count} messages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
