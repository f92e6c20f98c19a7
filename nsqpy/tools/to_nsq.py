"""to_nsq: publish each line of stdin (or each `--delimiter`-separated record) to a topic on every given nsqd.

Publishes are pipelined (up to WINDOW awaiting their OK per nsqd), so a file goes out at the connection's pace
rather than one round trip per line; order is kept, since one connection answers in order.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

from nsqpy.client import Producer
from nsqpy.tools.common import fail, normalize_argv, producer_options, setup_logging

WINDOW = 1000   # publishes in flight per nsqd before the reader waits for the oldest reply


def records(stream, delimiter: bytes):
    """Records without their delimiter; empty ones are skipped, as NSQ's to_nsq does."""
    pending = b""
    while True:
        chunk = stream.read(1 << 16)
        if not chunk:
            break
        pending += chunk
        *complete, pending = pending.split(delimiter)
        for record in complete:
            if record:
                yield record
    if pending:
        yield pending


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="to_nsq", description=__doc__)
    p.add_argument("--topic", required=True, help="NSQ topic to publish to")
    p.add_argument("--nsqd-tcp-address", action="append", default=[], help="destination nsqd TCP address (may "
                   "be given multiple times; every record goes to every address)")
    p.add_argument("--delimiter", default="\n", help="character to split input from stdin")
    p.add_argument("--rate", type=int, default=0, help="throttle messages per second (0: unlimited)")
    p.add_argument("--producer-opt", action="append", default=[], metavar="KEY,VALUE")
    args = p.parse_args(normalize_argv(sys.argv[1:] if argv is None else argv))
    setup_logging()
    if not args.nsqd_tcp_address:
        fail(p, "--nsqd-tcp-address is required")
    if len(args.delimiter.encode()) != 1:
        fail(p, "--delimiter must be a single byte")
    options = producer_options(p, args)
    producers = [Producer([a], **options) for a in args.nsqd_tcp_address]
    windows = [collections.deque() for _ in producers]
    count = 0
    started = time.monotonic()
    try:
        for record in records(sys.stdin.buffer, args.delimiter.encode()):
            if args.rate:   # pace to the rate: the n-th record leaves no earlier than n / rate s after start
                ahead = count / args.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            for producer, window in zip(producers, windows):
                window.append(producer.publish_async(args.topic, record))
                if len(window) >= WINDOW:
                    window.popleft().result()
            count += 1
        for window in windows:
            for future in window:
                future.result()
    except KeyboardInterrupt:
        pass
    finally:
        for producer in producers:
            producer.close()
    print(f"[to_nsq] published {count} messages to {len(producers)} nsqd(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
