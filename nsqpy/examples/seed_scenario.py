"""The seed scenario: one producer; channel A with two consumers that split the messages between them, channel
B with one consumer that gets every message. Prints who got what and exits 0 when the split is right.

    python -m nsqpy.examples.seed_scenario --nsqd-tcp-address=127.0.0.1:4150 [--count=1000]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time

from nsqpy.client import Consumer, Producer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="seed_scenario", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    p.add_argument("--topic", default=f"seed_{os.getpid()}")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for every delivery")
    args = p.parse_args(argv)
    address = [args.nsqd_tcp_address]
    got = collections.defaultdict(list)
    lock = threading.Lock()

    def handler(name):
        def handle(message):
            with lock:
                got[name].append(message.body)
        return handle

    # Subscribe first: a channel only receives messages published after it exists.
    consumers = {name: Consumer(args.topic, channel, handler(name), nsqd_tcp_addresses=address,
                                max_in_flight=50).start()
                 for name, channel in (("A1", "A"), ("A2", "A"), ("B", "B"))}
    bodies = [b"message %d" % i for i in range(args.count)]
    try:
        with Producer(address) as producer:
            for start in range(0, len(bodies), 100):
                producer.mpub(args.topic, bodies[start:start + 100])
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            with lock:
                if len(got["A1"]) + len(got["A2"]) >= args.count and len(got["B"]) >= args.count:
                    break
            time.sleep(0.05)   # polling the delivery counts, with a deadline
    finally:
        for c in consumers.values():
            c.stop()
    a_split = sorted(got["A1"] + got["A2"]) == sorted(bodies)
    b_all = sorted(got["B"]) == sorted(bodies)
    print(f"published {args.count} to {args.topic}: channel A split {len(got['A1'])} + {len(got['A2'])}, "
          f"channel B got {len(got['B'])}")
    ok = a_split and b_all and got["A1"] and got["A2"]
    print("OK: each message once on A (shared by two consumers), every message on B" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
