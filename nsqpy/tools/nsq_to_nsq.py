"""nsq_to_nsq: relay topics from one set of nsqds to another, optionally filtering JSON messages.

A message is FINed only after the destination acknowledged the PUB; a failed PUB is logged as one line and
the message is requeued. A destination that cannot be reached at the start ends the tool at once (one line,
exit status 1); on SIGINT/SIGTERM the producers stop first, so handlers waiting on a dead destination requeue
their messages at once instead of holding the stop up.

With --require-json-field, a message that is not a JSON object holding that field (equal to
--require-json-value when given) is FINed without being relayed; --whitelist-json-field keeps only the listed
fields.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
import threading

from nsqpy.client import ClientError, Consumer, Producer, ProtocolError
from nsqpy.client.errors import check_name
from nsqpy.tools.common import (Status, ToolError, add_consumer_flags, add_producer_flags, check_nsqds,
                                check_sources, connect_or_fail, consumer_options, entry_point, fail,
                                normalize_argv, parser, producer_options, run_consumers, setup_logging)

log = logging.getLogger("nsqpy.tools")


def filtered(body: bytes, args) -> bytes | None:
    """The body to relay, or None to drop it."""
    if not args.require_json_field and not args.whitelist_json_field:
        return body
    try:
        doc = json.loads(body)
    except ValueError:
        return None if args.require_json_field else body
    if not isinstance(doc, dict):
        return None if args.require_json_field else body
    if args.require_json_field:
        if args.require_json_field not in doc:
            return None
        if args.require_json_value and str(doc[args.require_json_field]) != args.require_json_value:
            return None
    if args.whitelist_json_field:
        doc = {k: v for k, v in doc.items() if k in args.whitelist_json_field}
        return json.dumps(doc, separators=(",", ":")).encode()
    return body


@entry_point("nsq_to_nsq")
def main(argv=None) -> int:
    p = parser("nsq_to_nsq", __doc__)
    add_consumer_flags(p, channel_default="nsq_to_nsq")
    p.add_argument("--destination-nsqd-tcp-address", action="append", default=[],
                   help="destination nsqd TCP address (may be given multiple times)")
    p.add_argument("--destination-topic", default="", help="destination topic (default: the source topic)")
    p.add_argument("--mode", default="hostpool", choices=["round-robin", "hostpool", "epsilon-greedy"],
                   help="round-robin: one producer per destination, used in turn; hostpool (epsilon-greedy is "
                   "the same here): one producer failing over along the list and back to the first")
    p.add_argument("--require-json-field", default="", help="relay only JSON objects holding this field (the "
                   "others are FINed without being relayed)")
    p.add_argument("--require-json-value", default="", help="with --require-json-field: relay only when the "
                   "field equals this value (compared as text)")
    p.add_argument("--whitelist-json-field", action="append", default=[], help="relay only these fields of JSON "
                   "objects (may be given multiple times)")
    p.add_argument("--status-every", type=int, default=250, help="print a status line every N messages (0: off)")
    add_producer_flags(p)
    args = p.parse_args(normalize_argv(sys.argv[1:] if argv is None else argv))
    setup_logging()
    check_sources(p, args)
    if not args.destination_nsqd_tcp_address:
        fail(p, "--destination-nsqd-tcp-address is required")
    if args.require_json_value and not args.require_json_field:
        fail(p, "--require-json-value needs --require-json-field")
    if args.destination_topic:
        check_name("topic", args.destination_topic)
    options = producer_options(p, args)
    if args.mode == "round-robin":    # one producer per destination, used in turn
        producers = [Producer([a], **options) for a in args.destination_nsqd_tcp_address]
    else:                             # one producer failing over along the list (hostpool)
        producers = [Producer(args.destination_nsqd_tcp_address, **options)]
    try:
        connect_or_fail(producers, "--destination-nsqd-tcp-address", "destination: ")
        check_nsqds(args, consumer_options(p, args))
    except ToolError:
        close_all(producers)
        raise
    turn = itertools.cycle(producers)
    lock = threading.Lock()
    status = Status("nsq_to_nsq", args.status_every)

    def handler_for(topic):
        destination = args.destination_topic or topic

        def handle(message):
            body = filtered(message.body, args)
            if body is None:
                return
            with lock:
                producer = next(turn)
            try:
                producer.publish(destination, body)
            except (ClientError, ProtocolError, TimeoutError) as err:
                log.warning("publish to %s failed: %s; message %s requeued (attempt %d)", destination, err,
                            message.id.decode(), message.attempts)
                return False
            status.tick()
        return handle

    consumers = [Consumer(t, args.channel, handler_for(t), nsqd_tcp_addresses=args.nsqd_tcp_address,
                          lookupd_http_addresses=args.lookupd_http_address, concurrency=4,
                          **consumer_options(p, args)) for t in args.topic]
    try:
        run_consumers(consumers, threading.Event(), before_stop=lambda: [p.stop() for p in producers])
    finally:
        close_all(producers)
    print(f"[nsq_to_nsq] relayed {status.total} messages", file=sys.stderr)
    return 0


def close_all(producers) -> None:
    for producer in producers:
        producer.close()


if __name__ == "__main__":
    sys.exit(main())
