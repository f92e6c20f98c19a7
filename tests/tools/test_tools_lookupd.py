"""The utilities finding nsqds through nsqpy's nsqlookupd: nsq_tail --lookupd-http-address and nsq_to_file
--topic-pattern (topics listed by lookupd's /topics)."""

import signal

from nsqpy.client import Consumer, Producer
from tests.client.helpers import addr, unique, wait_until
from tests.client.test_client_lookupd import _start_nsqlookupd
from tests.tools.test_tools_pipeline import Tool, output_lines


def test_nsq_tail_and_nsq_to_file_topic_pattern_through_lookupd(nsqd_factory, tmp_path):
    proc, tcp, http_address = _start_nsqlookupd()
    out = tmp_path / "out"     # tmp_path also holds the brokers' data paths
    try:
        node = nsqd_factory(f"--lookupd-tcp-address={tcp}", "--broadcast-address=127.0.0.1",
                            "--http-address=127.0.0.1:0", workers=1)
        prefix = unique("pattern")
        topics = [f"{prefix}_a", f"{prefix}_b"]
        for t in topics:   # create the topics (nsqd registers them with lookupd) without publishing anything
            Consumer(t, "first#ephemeral", lambda m: None, nsqd_tcp_addresses=[addr(node)]).start().stop()
        wait_until(lambda: _registered(http_address, topics), what="topics registered with lookupd")
        archiver = Tool("nsq_to_file", f"--topic-pattern=^{prefix}_", f"--lookupd-http-address={http_address}",
                        f"--output-dir={out}", "--sync-interval=0.2s")
        tail = Tool("nsq_tail", f"--topic={topics[0]}", f"--lookupd-http-address={http_address}", "-n", "1")
        wait_until(lambda: sum("connected to" in line for line in archiver.lines) == 2, what="archiver subscribed")
        tail.wait_for_line("connected to")
        with Producer([addr(node)]) as p:
            for t in topics:
                p.publish(t, t.encode())
        assert tail.finish() == topics[0].encode() + b"\n"
        wait_until(lambda: sorted(output_lines(out) if out.exists() else []) == sorted(t.encode() for t in topics),
                   what="both topics archived")
        archiver.proc.send_signal(signal.SIGTERM)
        archiver.finish()
    finally:
        proc.terminate()
        proc.wait(30)


def _registered(http_address, topics):
    from nsqpy.client.lookupd import http_get_json
    return set(topics) <= set(http_get_json(f"http://{http_address}/topics", 2.0).get("topics", []))
