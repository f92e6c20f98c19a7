"""nsq_stat: poll nsqd's `/stats?format=json` for one topic/channel and print one line of aggregate figures per
interval (summed over every nsqd: given directly, or every producer lookupd lists for the topic).

Columns, as NSQ's: ingress and egress rates (msgs/s over the last interval), depth (total, memory, disk),
in-flight, deferred, then requeue, timeout and message counts and connected clients. The header repeats every
25 lines. An nsqd that does not answer, or that lookupd stops listing, is said on stderr (one line per node per
interval) and counted in a `(N of M nsqd missing)` mark at the end of the row it is left out of (`no lookupd
answered` likewise).
"""

from __future__ import annotations

import signal
import sys
import threading
import urllib.error

from nsqpy.client.errors import describe
from nsqpy.client.lookupd import http_get_json, lookup_url
from nsqpy.tools.common import add_http_timeouts, duration, entry_point, fail, normalize_argv, parser

FIELDS = ("depth", "backend_depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count",
          "message_count", "client_count")
HEADER = ("------rate------+----------------depth----------------+--------------metadata---------------\n"
          "%7s %7s | %7s %7s %7s %5s %5s | %7s %7s %12s %7s" % (
              "ingress", "egress", "total", "mem", "disk", "inflt", "def", "req", "t-o", "msgs", "clients"))


class Nodes:
    """Which nsqds a report covers. With --nsqd-http-address, the given ones; with --lookupd-http-address, the
    union of what the lookupds list for the topic, plus every nsqd listed before that no lookupd lists now, so
    that a node that vanished is said rather than silently missing from the totals. When no lookupd answers,
    the nsqds seen before are polled directly."""

    def __init__(self, args, timeout: float):
        self.args, self.timeout = args, timeout
        self.seen: set[str] = set()
        self.blind = False          # no lookupd answered the last poll

    def poll(self) -> tuple[list[str], dict[str, str]]:
        """(the nsqds to ask for stats, {nsqd: why it is left out} for those known not to be listed)"""
        if self.args.nsqd_http_address:
            return list(self.args.nsqd_http_address), {}
        listed, answered = set(), 0
        for lookupd in self.args.lookupd_http_address:
            try:
                body = http_get_json(lookup_url(lookupd, self.args.topic), self.timeout)
            except urllib.error.HTTPError as err:
                if err.code != 404:   # 404: lookupd knows no nsqd with the topic
                    warn(f"lookupd {lookupd} did not answer (HTTP {err.code})")
                    continue
                body = {}
            except Exception as err:   # noqa: BLE001 (one line, whatever the reason)
                warn(f"lookupd {lookupd} did not answer ({describe(err)})")
                continue
            answered += 1
            for p in (body or {}).get("producers") or []:
                if p.get("http_port"):
                    listed.add(f"{p.get('broadcast_address') or p.get('address')}:{p['http_port']}")
        self.blind = not answered
        if not answered:
            if self.seen:
                warn(f"no lookupd answered: asking the {len(self.seen)} nsqd(s) seen before directly")
            return sorted(self.seen), {}
        gone = {a: f"is no longer listed by lookupd for topic {self.args.topic}" for a in self.seen - listed}
        self.seen |= listed
        return sorted(listed), gone


def node_stats(address, topic, channel, timeout) -> dict:
    """The channel's FIELDS on one nsqd (zeros where it does not have the channel). Raises if it does not
    answer."""
    base = address if "://" in address else "http://" + address
    url = f"{base.rstrip('/')}/stats?format=json&topic={topic}&channel={channel}&include_clients=false"
    stats = http_get_json(url, timeout)
    figures = dict.fromkeys(FIELDS, 0)
    for t in stats.get("topics") or []:
        if t.get("topic_name") != topic:
            continue
        for c in t.get("channels") or []:
            if c.get("channel_name") == channel:
                for f in FIELDS:
                    figures[f] += int(c.get(f) or 0)
    return figures


def poll_nodes(addresses, topic, channel, timeout) -> tuple[dict[str, dict], dict[str, str]]:
    """({nsqd: its figures} for those that answered, {nsqd: why not} for the others)"""
    figures, missing = {}, {}
    for address in addresses:
        try:
            figures[address] = node_stats(address, topic, channel, timeout)
        except Exception as err:   # noqa: BLE001 (one line, whatever the reason)
            missing[address] = f"did not answer ({describe(err)})"
    return figures, missing


def warn(text: str) -> None:
    print(f"nsq_stat: {text}", file=sys.stderr, flush=True)


def report(now: dict[str, dict], last: dict[str, dict], interval: float, notes: list[str]) -> str:
    """One row. Rates count only nsqds that answered both times, so a node dropping out is no negative rate;
    `notes` (what is missing, said on stderr too) go in parentheses at the end of the row."""
    total = {f: sum(n[f] for n in now.values()) for f in FIELDS}
    both = [a for a in now if a in last]
    messages = sum(now[a]["message_count"] - last[a]["message_count"] for a in both)
    depth = sum(now[a]["depth"] - last[a]["depth"] for a in both)
    row = "%7d %7d | %7d %7d %7d %5d %5d | %7d %7d %12d %7d" % (
        messages / interval, (messages - depth) / interval, total["depth"], total["depth"] - total["backend_depth"],
        total["backend_depth"], total["in_flight_count"], total["deferred_count"], total["requeue_count"],
        total["timeout_count"], total["message_count"], total["client_count"])
    if notes:
        row += "  (" + "; ".join(notes) + ")"
    return row


@entry_point("nsq_stat")
def main(argv=None) -> int:
    p = parser("nsq_stat", __doc__)
    p.add_argument("--topic", default="", help="NSQ topic")
    p.add_argument("--channel", default="", help="NSQ channel")
    p.add_argument("--nsqd-http-address", action="append", default=[], help="nsqd HTTP address (may be given "
                   "multiple times)")
    p.add_argument("--lookupd-http-address", action="append", default=[], help="lookupd HTTP address (may be "
                   "given multiple times)")
    p.add_argument("--interval", type=duration, default=2.0, help="duration of time between polling/printing")
    p.add_argument("--count", type=int, default=0, help="number of reports (0: until SIGINT/SIGTERM)")
    add_http_timeouts(p, request=5.0)
    args = p.parse_args(normalize_argv(sys.argv[1:] if argv is None else argv))
    if not args.topic or not args.channel:
        fail(p, "--topic and --channel are required")
    if bool(args.nsqd_http_address) == bool(args.lookupd_http_address):
        fail(p, "use --nsqd-http-address or --lookupd-http-address, not both (and one is required)")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    timeout = args.http_client_connect_timeout + args.http_client_request_timeout
    nodes = Nodes(args, timeout)
    last = None
    reports = 0
    try:
        for i in range(sys.maxsize):
            addresses, missing = nodes.poll()
            now, failed = poll_nodes(addresses, args.topic, args.channel, timeout)
            missing.update(failed)
            for address in sorted(missing):
                warn(f"nsqd {address} {missing[address]}; its figures are left out of this report")
            if i % 25 == 0:
                print(HEADER, flush=True)
            if last is not None:
                notes = [f"{len(missing)} of {len(missing) + len(now)} nsqd missing"] if missing else []
                if nodes.blind:
                    notes.append("no lookupd answered")
                print(report(now, last, args.interval, notes), flush=True)
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
