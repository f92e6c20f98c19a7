"""What the utilities share: NSQ's flag spellings, `--version`, `--consumer-opt`/`--producer-opt`, the
nsqd-or-lookupd rule, running several consumers until SIGINT/SIGTERM, the periodic status line, and the error
boundary: a tool raises `ToolError` (what is wrong and what to do) and `@entry_point` prints it as one line on
stderr and exits 1, as NSQ's tools do with `log.Fatal`.

NSQ's tools are Go programs, so their users type `-topic=x` as often as `--topic=x`; `normalize_argv` turns a
single-dash long flag into the double-dash form argparse knows (single letters such as `-n` stay as they are).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import signal
import sys
import threading
import time

from nsqpy.client import ClientError, Config, Consumer, InvalidName, Producer
from nsqpy.client.config import VERSION
from nsqpy.client.errors import check_name
from nsqpy.config.duration import SECOND, parse_duration

__all__ = ["normalize_argv", "duration", "add_consumer_flags", "add_producer_flags", "add_http_timeouts",
           "consumer_options", "producer_options", "connect_or_fail", "check_nsqds", "check_names",
           "run_consumers", "Status", "fail", "ToolError", "entry_point", "parser"]

log = logging.getLogger("nsqpy.tools")


class ToolError(Exception):
    """A condition that ends the tool: the text says what is wrong and what to do, in one line."""


def entry_point(prog: str):
    """Wrap a tool's main(argv) -> int: a ToolError (or a bad topic/channel name) becomes `prog: text` on
    stderr and exit status 1, instead of a traceback."""
    def wrap(main):
        @functools.wraps(main)
        def run(argv=None) -> int:
            try:
                return main(argv)
            except (ToolError, InvalidName) as err:
                print(f"{prog}: {err}", file=sys.stderr, flush=True)
                return 1
        return run
    return wrap


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An ArgumentParser with NSQ's `--version` (`<prog> v<version> (nsqpy)`, exit 0)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--version", action="version", version=f"{prog} v{VERSION} (nsqpy)",
                   help="print the version and exit")
    return p



def normalize_argv(argv):
    out = []
    for arg in argv:
        if arg.startswith("-") and not arg.startswith("--") and len(arg.split("=", 1)[0]) > 2:
            arg = "-" + arg
        out.append(arg)
    return out


def duration(text: str) -> float:
    """Go duration text ("2s", "1m") -> seconds; a bare number is seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text) / SECOND
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def fail(parser: argparse.ArgumentParser, message: str):
    parser.error(message)


def add_consumer_flags(p: argparse.ArgumentParser, channel_default: str | None, topics_repeatable=True) -> None:
    p.add_argument("--topic", action="append", default=[], help="NSQ topic" + (" (may be given multiple times)"
                                                                                if topics_repeatable else ""))
    p.add_argument("--channel", default=channel_default, help="NSQ channel")
    p.add_argument("--nsqd-tcp-address", action="append", default=[], help="nsqd TCP address (may be given "
                   "multiple times)")
    p.add_argument("--lookupd-http-address", action="append", default=[], help="lookupd HTTP address (may be "
                   "given multiple times)")
    p.add_argument("--max-in-flight", type=int, default=200, help="max number of messages to allow in flight")
    p.add_argument("--consumer-opt", action="append", default=[], metavar="KEY,VALUE",
                   help="option to pass through to the consumer (may be given multiple times)")


def add_producer_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--producer-opt", action="append", default=[], metavar="KEY,VALUE",
                   help="option to pass through to the producer, e.g. write_timeout,2s (may be given multiple "
                   "times)")


def add_http_timeouts(p: argparse.ArgumentParser, request: float) -> None:
    """NSQ's two HTTP client timeouts; urllib has one, so each request may take up to their sum."""
    p.add_argument("--http-client-connect-timeout", type=duration, default=2.0,
                   help="HTTP connect timeout (each request may take up to this plus the request timeout)")
    p.add_argument("--http-client-request-timeout", type=duration, default=request, help="HTTP request timeout")


def check_sources(p: argparse.ArgumentParser, args) -> None:
    if not args.topic:
        fail(p, "--topic is required")
    if bool(args.nsqd_tcp_address) == bool(args.lookupd_http_address):
        fail(p, "use --nsqd-tcp-address or --lookupd-http-address, not both (and one is required)")
    check_names(args)


def check_names(args) -> None:
    """InvalidName for a bad --topic or --channel, before anything is dialled."""
    for topic in args.topic:
        check_name("topic", topic)
    if args.channel:
        check_name("channel", args.channel)


def _options(p, pairs, base: dict) -> dict:
    kinds = {f.name: f for f in dataclasses.fields(Config)}
    out = dict(base)
    for pair in pairs:
        key, sep, value = pair.partition(",")
        key = key.strip().replace("-", "_")
        if not sep or key not in kinds:
            fail(p, f"unknown or malformed option {pair!r} (known: {', '.join(sorted(kinds))})")
        default = kinds[key].default
        if isinstance(default, bool):
            out[key] = value.lower() in ("1", "true", "t", "yes")
        elif isinstance(default, float):
            out[key] = duration(value)
        elif isinstance(default, int):
            out[key] = int(value)
        else:
            out[key] = value
    return out


def connect_or_fail(producers, flag: str, what: str = "") -> None:
    """Dial each producer now, trying each of its addresses once; a ToolError naming `flag` if one cannot."""
    for producer in producers:
        try:
            producer.connect(timeout=0)
        except ClientError as err:
            raise ToolError(f"{what}{err}; start nsqd there or fix {flag}") from None


def check_nsqds(args, options: dict) -> None:
    """NSQ's consumer tools end at once when an --nsqd-tcp-address does not answer (go-nsq's ConnectToNSQDs
    fails): dial each once, with the consumer's options (TLS, AUTH), before any consumer starts."""
    for address in args.nsqd_tcp_address:
        probe = Producer([address], **options)
        try:
            connect_or_fail([probe], "--nsqd-tcp-address")
        finally:
            probe.close()


def consumer_options(p, args) -> dict:
    return _options(p, args.consumer_opt, {"max_in_flight": args.max_in_flight})


def producer_options(p, args) -> dict:
    return _options(p, getattr(args, "producer_opt", []), {})


def run_consumers(consumers: list[Consumer], stop: threading.Event, before_stop=None) -> None:
    """Start them, wait for `stop` (set by SIGINT/SIGTERM or by the tool), then stop them gracefully.
    `before_stop()` runs first (e.g. closing producers, so that handlers waiting on them return at once)."""
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for c in consumers:
            c.start()
        while not stop.wait(0.2):   # wakes the main thread so Python runs signal handlers promptly
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if before_stop is not None:
            before_stop()
        for c in consumers:
            c.stop()


class Status:
    """`[name] <n> messages, <rate>/s (total <t>)` on stderr every `every` messages (0: never)."""

    def __init__(self, name: str, every: int):
        self.name, self.every = name, every
        self.total = 0
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._count = 0

    def tick(self, n: int = 1) -> None:
        with self._lock:
            self.total += n
            self._count += n
            if self.every and self._count >= self.every:
                now = time.monotonic()
                rate = self._count / max(now - self._since, 1e-9)
                print(f"[{self.name}] {self._count} messages, {rate:.1f}/s (total {self.total})", file=sys.stderr,
                      flush=True)
                self._since, self._count = now, 0


def setup_logging(level: str = "info") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s: %(message)s")
