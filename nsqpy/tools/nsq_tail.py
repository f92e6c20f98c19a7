"""nsq_tail: consume topics and print each message to stdout (an ephemeral channel by default).

When stdout goes away (`nsq_tail ... | head -3`), the message that could not be written is requeued and the tool
stops with one line and exit status 1, as NSQ's does.
"""

from __future__ import annotations

import os
import random
import sys
import threading

from nsqpy.client import Consumer
from nsqpy.client.errors import describe
from nsqpy.tools.common import (ToolError, add_consumer_flags, check_nsqds, check_sources, consumer_options,
                                entry_point, normalize_argv, parser, run_consumers, setup_logging)


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
    check_nsqds(args, options)
    out = sys.stdout.buffer
    lock = threading.Lock()
    stop = threading.Event()
    shown = 0
    broken: list[OSError] = []

    def handler_for(topic: str):
        def handle(message):
            nonlocal shown
            with lock:
                if broken or (args.total_messages and shown >= args.total_messages):
                    message.req(0, backoff=False)   # over the count, or nowhere to print: leave it
                    return
                try:
                    out.write((topic.encode() + b" | " if args.print_topic else b"") + message.body + b"\n")
                    out.flush()
                except OSError as err:
                    broken.append(err)
                    message.req(0, backoff=False)
                    stop.set()
                    return
                shown += 1
                if args.total_messages and shown >= args.total_messages:
                    stop.set()
        return handle

    consumers = [Consumer(t, channel, handler_for(t), nsqd_tcp_addresses=args.nsqd_tcp_address,
                          lookupd_http_addresses=args.lookupd_http_address, **options) for t in args.topic]
    run_consumers(consumers, stop)
    if broken:
        # the interpreter's own flush of stdout at exit would fail too, with a traceback: point it elsewhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise ToolError(f"cannot write to stdout ({describe(broken[0])}); the message is requeued")
    return 0


if __name__ == "__main__":
    sys.exit(main())
