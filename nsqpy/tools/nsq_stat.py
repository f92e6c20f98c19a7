"""nsq_stat: poll nsqd's `/stats?format=json` for one topic/channel and print one line of aggregate figures per
interval (summed over every nsqd: given directly, or every producer lookupd lists for the topic).

Columns, as NSQ's: ingress and egress rates (msgs/s over the last interval), depth (total, memory, disk),
in-flight, deferred, then requeue, timeout and message counts and connected clients. The header repeats every
25 lines.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from nsqpy.client.lookupd import http_get_json, lookup_url
from nsqpy.tools.common import duration, fail, normalize_argv

FIELDS = ("depth", "backend_depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count",
          "message_count", "client_count")
HEADER = ("------rate------+----------------depth----------------+--------------metadata---------------\n"
          "%7s %7s | %7s %7s %7s %5s %5s | %7s %7s %12s %7s" % (
              "ingress", "egress", "total", "mem", "disk", "inflt", "def", "req", "t-o", "msgs", "clients"))


def nsqd_http_addresses(args, timeout) -> list[str]:
    if args.nsqd_http_address:
        return args.nsqd_http_address
    found = []
    for lookupd in args.lookupd_http_address:
        try:
            body = http_get_json(lookup_url(lookupd, args.topic), timeout)
        except Exception as err:
            print(f"[nsq_stat] lookupd {lookupd}: {err}", file=sys.stderr)
            continue
        for p in (body or {}).get("producers") or []:
            found.append(f"{p.get('broadcast_address') or p.get('address')}:{p['http_port']}")
    return sorted(set(found))


def channel_totals(addresses, topic, channel, timeout) -> dict:
    totals = dict.fromkeys(FIELDS, 0)
    for address in addresses:
        base = address if "://" in address else "http://" + address
        url = f"{base.rstrip('/')}/stats?format=json&topic={topic}&channel={channel}&include_clients=false"
        try:
            stats = http_get_json(url, timeout)
        except Exception as err:
            print(f"[nsq_stat] nsqd {address}: {err}", file=sys.stderr)
            continue
        for t in stats.get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            for c in t.get("channels") or []:
                if c.get("channel_name") == channel:
                    for f in FIELDS:
                        totals[f] += int(c.get(f) or 0)
    return totals


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nsq_stat", description=__doc__)
    p.add_argument("--topic", default="", help="NSQ topic")
    p.add_argument("--channel", default="", help="NSQ channel")
    p.add_argument("--nsqd-http-address", action="append", default=[], help="nsqd HTTP address (may be given "
                   "multiple times)")
    p.add_argument("--lookupd-http-address", action="append", default=[], help="lookupd HTTP address (may be "
                   "given multiple times)")
    p.add_argument("--interval", type=duration, default=2.0, help="duration of time between polling/printing")
    p.add_argument("--count", type=int, default=0, help="number of reports (0: until SIGINT/SIGTERM)")
    p.add_argument("--http-client-connect-timeout", type=duration, default=2.0)
    p.add_argument("--http-client-request-timeout", type=duration, default=5.0)
    args = p.parse_args(normalize_argv(sys.argv[1:] if argv is None else argv))
    if not args.topic or not args.channel:
        fail(p, "--topic and --channel are required")
    if bool(args.nsqd_http_address) == bool(args.lookupd_http_address):
        fail(p, "use --nsqd-http-address or --lookupd-http-address, not both (and one is required)")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    timeout = args.http_client_connect_timeout + args.http_client_request_timeout
    last = None
    reports = 0
    try:
        for i in range(sys.maxsize):
            now = channel_totals(nsqd_http_addresses(args, timeout), args.topic, args.channel, timeout)
            if i % 25 == 0:
                print(HEADER, flush=True)
            if last is not None:
                ingress = (now["message_count"] - last["message_count"]) / args.interval
                egress = (now["message_count"] - last["message_count"] - (now["depth"] - last["depth"])) / \
                    args.interval
                print("%7d %7d | %7d %7d %7d %5d %5d | %7d %7d %12d %7d" % (
                    ingress, egress, now["depth"], now["depth"] - now["backend_depth"], now["backend_depth"],
                    now["in_flight_count"], now["deferred_count"], now["requeue_count"], now["timeout_count"],
                    now["message_count"], now["client_count"]), flush=True)
                reports += 1
                if args.count and reports >= args.count:
                    break
            last = now
            if stop.wait(args.interval):
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
