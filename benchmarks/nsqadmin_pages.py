"""nsqadmin's page load and API times on a cluster of N nsqd x T topics x C channels, and its memory.

    python -m benchmarks.nsqadmin_pages [--nodes 3] [--topics 100] [--channels 5] [--rounds 20]

Starts one nsqpy nsqlookupd, N nsqpy nsqd (one worker each) registered with it, creates every topic on every node
with its channels and one message, starts ``nsqadmin --lookupd-http-address``, then measures: the JSON routes
(median and max of ``--rounds`` sequential GETs), and with headless Chromium (if installed) the time from
navigation to the rendered topics list and topic page. Then the resident memory of nsqadmin's processes
(supervisor, gunicorn arbiter, its worker). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lookupd"))
sys.path.insert(0, str(ROOT))

from lookupd_wire import Lookupd  # noqa: E402
from tests.admin.admin_wire import Admin, eventually  # noqa: E402
from tests.broker.conftest import Nsqd  # noqa: E402


def post(address, path, body=b""):
    conn = http.client.HTTPConnection(*address, timeout=60)
    try:
        conn.request("POST", path, body=body)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, (path, resp.status)
    finally:
        conn.close()


def timed_get(address, path, rounds):
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        conn = http.client.HTTPConnection(*address, timeout=60)
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        conn.close()
        assert resp.status == 200, (path, resp.status)
        times.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def tree(pid):
    out = [pid]
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    for child in children:
        out.extend(tree(int(child)))
    return out


def browser_times(admin, topic, rounds):
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--user-data-dir={tempfile.mkdtemp()}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    out = {}
    try:
        for name, path, selector in (("topics_page", "/topics", "#topics tr[data-topic]"),
                                     ("topic_page", f"/topics/{topic}", "#topic-channels tr[data-channel]")):
            times = []
            for _ in range(rounds):
                driver.get("about:blank")
                started = time.perf_counter()
                driver.get(admin.url + path)
                WebDriverWait(driver, 60, poll_frequency=0.01).until(
                    lambda d: d.find_elements(By.CSS_SELECTOR, selector))
                times.append((time.perf_counter() - started) * 1000)
            out[name] = {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}
    finally:
        driver.quit()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--channels", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    procs = []
    try:
        lk = Lookupd()
        procs.append(lk)
        nodes = []
        for i in range(args.nodes):
            data = tempfile.mkdtemp(prefix="nsqadmin-bench-")
            n = Nsqd(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={data}",
                      "--workers=1", f"--node-id={100 + i}", "--broadcast-address=127.0.0.1",
                      f"--lookupd-tcp-address={lk.tcp}"], data, 100 + i)
            procs.append(n)
            nodes.append(n)
        topics = [f"bench-{i:03d}" for i in range(args.topics)]
        for n in nodes:
            for t in topics:
                post(n.http_address, f"/pub?topic={t}", b"m")
                for c in range(args.channels):
                    post(n.http_address, f"/channel/create?topic={t}&channel=ch{c}")
        eventually(lambda: len(lk.get_json("/topics")["topics"]) == args.topics, timeout=300, what="registered")
        eventually(lambda: len(lk.producer_ports(topics[-1])) == args.nodes, timeout=300, what="every producer")
        admin = Admin(f"--lookupd-http-address={lk.http}")
        procs.append(admin)
        timed_get(admin.address, "/api/topics", 2)  # warm
        result = {"nodes": args.nodes, "topics": args.topics, "channels": args.channels, "rounds": args.rounds,
                  "api": {path: timed_get(admin.address, path, args.rounds) for path in (
                      "/api/topics", f"/api/topics/{topics[0]}", f"/api/topics/{topics[0]}/ch0", "/api/nodes",
                      "/api/counter", "/metrics", "/")}}
        result["browser"] = browser_times(admin, topics[0], max(3, args.rounds // 4))
        pids = tree(admin.proc.pid)
        result["nsqadmin_rss_kib"] = {str(pid): rss_kib(pid) for pid in pids}
        result["nsqadmin_rss_total_mib"] = round(sum(result["nsqadmin_rss_kib"].values()) / 1024, 1)
        print(json.dumps(result))
    finally:
        for p in reversed(procs):
            p.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
