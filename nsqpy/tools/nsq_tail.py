"""nsq_tail: consume topics and print each message to stdout (an ephemeral channel by default)."""

from __future__ import annotations

import random
import sys
import threading

from nsqpy.client import Consumer
from nsqpy.tools.common import (add_consumer_flags, check_sources, consumer_options, entry_point, normalize_argv,
                                parser, run_consumers, setup_logging)


@entry_point("nsq_tail")
def main(argv=None) -> int:
    p = parser("nsq_tail", __doc__)
    add_consumer_flags(p, channel_default=None)
    p.add_argument("-n", "--total-messages", type=int, default=0, help="total messages to show (will wait if "
                   "starved)")
    p.add_argument("--print-topic", action="store_true", help="print topic name where message was received")
    args = p.parse_args(normalize_argv(sys.argv[1:] if argv is None else argv))
    setup_logging()
    check_sources(p, args)
    channel = args.channel or "tail%06d#ephemeral" % random.randrange(1_000_000)
    if args.total_messages and args.total_messages < args.max_in_flight:
        args.max_in_flight = args.total_messages   # as NSQ's: no more in flight than will be shown
    options = consumer_options(p, args)
    out = sys.stdout.buffer
    lock = threading.Lock()
    stop = threading.Event()
    shown = 0

    def handler_for(topic: str):
        def handle(message):
            nonlocal shown
            with lock:
                if args.total_messages and shown >= args.total_messages:
                    message.req(0, backoff=False)   # over the count: leave it for someone else
                    return
                if args.print_topic:
                    out.write(topic.encode() + b" | ")
                out.write(message.body + b"\n")
                out.flush()
                shown += 1
                if args.total_messages and shown >= args.total_messages:
                    stop.set()
        return handle

    consumers = [Consumer(t, channel, handler_for(t), nsqd_tcp_addresses=args.nsqd_tcp_address,
                          lookupd_http_addresses=args.lookupd_http_address, **options) for t in args.topic]
    run_consumers(consumers, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
