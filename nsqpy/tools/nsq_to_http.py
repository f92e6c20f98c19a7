"""nsq_to_http: consume a topic and make one HTTP request per message: GET (`%s` in the URL replaced by the
URL-escaped body) or POST (the body as the request body). A POST answered 2xx or a GET answered 200 FINs the
message; anything else is logged as one line and the message is requeued (with backoff).

Modes pick the destination among several URLs: round-robin cycles through them; hostpool (and epsilon-greedy,
which nsqpy treats as hostpool) sticks to one URL and moves to the next after a failure.
"""

from __future__ import annotations

import itertools
import logging
import random
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

from nsqpy.client import Consumer
from nsqpy.client.errors import describe
from nsqpy.tools.common import (Status, add_consumer_flags, add_http_timeouts, check_nsqds, check_sources,
                                consumer_options, entry_point, fail, normalize_argv, parser, run_consumers,
                                setup_logging)

log = logging.getLogger("nsqpy.tools")


class RequestFailed(Exception):
    """The request did not succeed; the text is one line for the log."""


class Publisher:
    def __init__(self, args):
        self.args = args
        self.urls = args.get or args.post
        self.method = "GET" if args.get else "POST"
        self.headers = {"Content-Type": args.content_type}
        for header in args.header:
            key, _, value = header.partition("=") if "=" in header else header.partition(":")
            self.headers[key.strip()] = value.strip()
        self._cycle = itertools.cycle(range(len(self.urls)))
        self._current = 0
        self._lock = threading.Lock()
        self.timeout = args.http_client_connect_timeout + args.http_client_request_timeout

    def _pick(self) -> int:
        with self._lock:
            return next(self._cycle) if self.args.mode == "round-robin" else self._current

    def _failed(self, index: int) -> None:
        with self._lock:
            if index == self._current:
                self._current = (self._current + 1) % len(self.urls)

    def send(self, body: bytes) -> None:
        index = self._pick()
        url = self.urls[index]
        if self.method == "GET":
            request = urllib.request.Request(url.replace("%s", urllib.parse.quote(body, safe="")),
                                             headers=self.headers, method="GET")
        else:
            request = urllib.request.Request(url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status = response.status
                response.read()
        except urllib.error.HTTPError as err:
            status = err.code
        except (OSError, ValueError) as err:   # unreachable, timed out, or a malformed URL
            self._failed(index)
            raise RequestFailed(f"{self.method} {url}: {describe(err)}") from None
        ok = status == 200 if self.method == "GET" else 200 <= status < 300
        if not ok:
            self._failed(index)
            raise RequestFailed(f"{self.method} {url}: HTTP {status}")


@entry_point("nsq_to_http")
def main(argv=None) -> int:
    p = parser("nsq_to_http", __doc__)
    add_consumer_flags(p, channel_default="nsq_to_http")
    p.add_argument("--get", action="append", default=[], help="HTTP address to make a GET request to; '%%s' "
                   "is replaced by the URL-escaped message (may be given multiple times)")
    p.add_argument("--post", action="append", default=[], help="HTTP address to POST the message to (may be "
                   "given multiple times)")
    p.add_argument("--content-type", default="application/octet-stream", help="Content-Type of POSTs")
    p.add_argument("--header", action="append", default=[], help="extra header k=v (may be given multiple times)")
    p.add_argument("--mode", default="hostpool", choices=["round-robin", "hostpool", "epsilon-greedy"],
                   help="round-robin: the URLs in turn; hostpool (epsilon-greedy is the same here): one URL, "
                   "moving to the next after a failure")
    p.add_argument("-n", "--concurrency", dest="n", type=int, default=100, help="number of concurrent publishers")
    p.add_argument("--sample", type=float, default=1.0, help="fraction of messages to send (0.0-1.0)")
    p.add_argument("--status-every", type=int, default=250, help="print a status line every N messages (0: off)")
    add_http_timeouts(p, request=20.0)
    args = p.parse_args(normalize_argv(sys.argv[1:] if argv is None else argv))
    setup_logging()
    check_sources(p, args)
    if bool(args.get) == bool(args.post):
        fail(p, "use --get or --post (one kind only)")
    if len(args.topic) != 1:
        fail(p, "--topic is required (once)")
    if not 0.0 <= args.sample <= 1.0:
        fail(p, "--sample must be between 0.0 and 1.0")
    options = consumer_options(p, args)
    check_nsqds(args, options)
    publisher = Publisher(args)
    status = Status("nsq_to_http", args.status_every)

    def handle(message):
        if args.sample < 1.0 and random.random() > args.sample:
            return   # not sampled: FIN without sending, as NSQ's
        try:
            publisher.send(message.body)
        except RequestFailed as err:
            log.warning("%s; message %s requeued (attempt %d)", err, message.id.decode(), message.attempts)
            return False
        status.tick()

    consumer = Consumer(args.topic[0], args.channel, handle, nsqd_tcp_addresses=args.nsqd_tcp_address,
                        lookupd_http_addresses=args.lookupd_http_address, concurrency=args.n, **options)
    run_consumers([consumer], threading.Event())
    print(f"[nsq_to_http] sent {status.total} messages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
