"""to_nsq: publish each line of stdin (or each `--delimiter`-separated record) to a topic on every given nsqd.

Publishes are pipelined (up to WINDOW awaiting their OK per nsqd), so a file goes out at the connection's pace
rather than one round trip per line; order is kept, since one connection answers in order.

As NSQ's to_nsq, it stops at the first record nsqd refuses (too large, bad topic), with one line saying why and
exit status 1, after waiting for the replies to what it already sent; an nsqd that cannot be reached at the
start is said at once the same way.
"""

from __future__ import annotations

import collections
import sys
import time

from nsqpy.client import ClientError, Producer, ProtocolError
from nsqpy.client.errors import check_name
from nsqpy.tools.common import (ToolError, add_producer_flags, connect_or_fail, entry_point, fail, normalize_argv,
                                parser, producer_options, setup_logging)

WINDOW = 1000   # publishes in flight per nsqd before the reader waits for the oldest reply
HINTS = {   # what to do about the errors nsqd gives for a record
    "E_BAD_MESSAGE": "split the record or raise nsqd's --max-msg-size",
    "E_BAD_TOPIC": "fix --topic",
    "E_PUB_FAILED": "see nsqd's log",
}


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


@entry_point("to_nsq")
def main(argv=None) -> int:
    p = parser("to_nsq", __doc__)
    p.add_argument("--topic", required=True, help="NSQ topic to publish to")
    p.add_argument("--nsqd-tcp-address", action="append", default=[], help="destination nsqd TCP address (may "
                   "be given multiple times; every record goes to every address)")
    p.add_argument("--delimiter", default="\n", help="character to split input from stdin")
    p.add_argument("--rate", type=int, default=0, help="throttle messages per second (0: unlimited)")
    add_producer_flags(p)
    args = p.parse_args(normalize_argv(sys.argv[1:] if argv is None else argv))
    setup_logging()
    if not args.nsqd_tcp_address:
        fail(p, "--nsqd-tcp-address is required")
    if len(args.delimiter.encode()) != 1:
        fail(p, "--delimiter must be a single byte")
    check_name("topic", args.topic)
    options = producer_options(p, args)
    producers = [Producer([a], **options) for a in args.nsqd_tcp_address]
    try:
        connect_or_fail(producers, "--nsqd-tcp-address")   # say at once that an nsqd is not there
        count = publish_all(producers, args)
    finally:
        for producer in producers:
            producer.close()
    print(f"[to_nsq] published {count} messages to {len(producers)} nsqd(s)", file=sys.stderr)
    return 0


def publish_all(producers, args) -> int:
    """Publish every record to every producer; the number of records read. Raises ToolError on the first
    record refused (after the replies to all that was sent)."""
    windows = [collections.deque() for _ in producers]   # (record number, future) awaiting nsqd's reply
    failure = None
    count = 0
    started = time.monotonic()

    def settle(number, future, address):
        nonlocal failure
        try:
            future.result()
        except (ProtocolError, ClientError) as err:
            if failure is None:
                failure = f"record {number} not published to {address}: {err}"
                if isinstance(err, ProtocolError) and err.code in HINTS:
                    failure += f" ({HINTS[err.code]})"
    try:
        for record in records(sys.stdin.buffer, args.delimiter.encode()):
            if args.rate:   # pace to the rate: the n-th record leaves no earlier than n / rate s after start
                ahead = count / args.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            count += 1
            for producer, window, address in zip(producers, windows, args.nsqd_tcp_address):
                window.append((count, producer.publish_async(args.topic, record)))
                if len(window) >= WINDOW:
                    settle(*window.popleft(), address)
            if failure is not None:
                break
    except KeyboardInterrupt:
        pass
    finally:
        for window, address in zip(windows, args.nsqd_tcp_address):
            while window:
                settle(*window.popleft(), address)
    if failure is not None:
        raise ToolError(f"{failure}; stopped reading after record {count}")
    return count


if __name__ == "__main__":
    sys.exit(main())
