"""What nsqadmin asks of the cluster: topics, channels, producers and stats gathered from every nsqlookupd or
nsqd, and the admin actions fanned out to them (the jobs of Go's internal/clusterinfo).

    ci = ClusterInfo(Upstream(...))
    topics, warnings = ci.lookupd_topics(["127.0.0.1:4161"])

Error handling, as in Go: every query goes to all the addresses in parallel; when some fail, the answer is built
from the others and each failure's text is returned in ``warnings`` (a list of strings, which the API turns into
its ``message``: a down node is named there, not silently left out); when all fail (or there was no address to
ask) ``AllFailed`` is raised, which the API turns into 502 ``UPSTREAM_ERROR: ...``. Actions collect the warnings
of every step and go on, so a tombstone that one lookupd missed still deletes the topic on the node.
"""
from __future__ import annotations

from urllib.parse import quote

from .aggregate import ChannelTotal, topic_row
from .upstream import Upstream, UpstreamError

__all__ = ["ClusterInfo", "AllFailed", "http_address", "tcp_address"]


class AllFailed(UpstreamError):
    """No address answered: ``failed to query any nsqd: <each error>``."""

    def __init__(self, kind: str, errors: list[str]):
        super().__init__(f"failed to query any {kind}: " + "\n".join(errors))
        self.errors = errors


def _q(value: str) -> str:
    return quote(value, safe="")


def _join(host: str, port) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_address(producer: dict) -> str:
    return _join(producer["broadcast_address"], producer["http_port"])


def tcp_address(producer: dict) -> str:
    return _join(producer["broadcast_address"], producer["tcp_port"])


def _semver(text: str) -> tuple:
    core = (text or "").split("-")[0].split("+")[0].split(".")
    try:
        return tuple(int(x) for x in core) if len(core) == 3 else (0, 0, 0)
    except ValueError:
        return (0, 0, 0)


def _producer(version="", broadcast_address="", hostname="", http_port=0, tcp_port=0, remote_address="",
              topics=()) -> dict:
    return {"remote_addresses": [], "remote_address": remote_address, "hostname": hostname,
            "broadcast_address": broadcast_address, "tcp_port": tcp_port, "http_port": http_port,
            "version": version, "topics": list(topics), "out_of_date": False}


class ClusterInfo:
    def __init__(self, upstream: Upstream, log=None):
        self.upstream = upstream
        self.log = log

    # ---- the fan-out ---------------------------------------------------------------------------------------

    def _gather(self, kind: str, addresses, fetch) -> tuple[list, list[str]]:
        """[(address, answer)] of those that answered, and the warnings; AllFailed when none did."""
        answers, errors = [], []
        for address, got in self.upstream.fan_out(fetch, addresses):
            if isinstance(got, UpstreamError):
                errors.append(str(got))
            else:
                answers.append((address, got))
        if len(errors) == len(addresses):
            raise AllFailed(kind, errors)
        return answers, errors

    def _get(self, url: str):
        if self.log is not None:
            self.log.debug(f"CI: querying {url}")
        return self.upstream.get_json(url)

    def _post_each(self, urls) -> list[str]:
        errors = []
        for _, got in self.upstream.fan_out(self._post, urls):
            if isinstance(got, UpstreamError):
                errors.append(str(got))
        return errors

    def _post(self, url: str):
        if self.log is not None:
            self.log.debug(f"CI: querying {url}")
        self.upstream.post(url)
        return True

    # ---- nsqlookupd ----------------------------------------------------------------------------------------

    def lookupd_topics(self, lookupds) -> tuple[list[str], list[str]]:
        answers, errors = self._gather("nsqlookupd", lookupds, lambda a: self._get(f"http://{a}/topics"))
        return sorted({t for _, doc in answers for t in doc.get("topics") or ()}), errors

    def lookupd_topic_channels(self, topic: str, lookupds) -> tuple[list[str], list[str]]:
        answers, errors = self._gather("nsqlookupd", lookupds,
                                       lambda a: self._get(f"http://{a}/channels?topic={_q(topic)}"))
        return sorted({c for _, doc in answers for c in doc.get("channels") or ()}), errors

    def lookupd_producers(self, lookupds) -> tuple[list[dict], list[str]]:
        answers, errors = self._gather("nsqlookupd", lookupds, lambda a: self._get(f"http://{a}/nodes"))
        by_tcp: dict[str, dict] = {}
        for address, doc in answers:
            for raw in doc.get("producers") or ():
                p = _producer(raw.get("version", ""), raw.get("broadcast_address", ""), raw.get("hostname", ""),
                              raw.get("http_port", 0), raw.get("tcp_port", 0), raw.get("remote_address", ""))
                tombstones = raw.get("tombstones") or []
                p["topics"] = sorted(({"topic": t, "tombstoned": bool(tombstones[i]) if i < len(tombstones)
                                       else False} for i, t in enumerate(raw.get("topics") or ())),
                                     key=lambda pt: pt["topic"])
                found = by_tcp.setdefault(tcp_address(p), p)
                found["remote_addresses"].append(f"{address}/{p['remote_address'] or 'N/A'}")
        producers = list(by_tcp.values())
        newest = max((_semver(p["version"]) for p in producers), default=(0, 0, 0))
        for p in producers:
            p["out_of_date"] = _semver(p["version"]) < newest
        producers.sort(key=lambda p: p["hostname"])
        return producers, errors

    def lookupd_topic_producers(self, topic: str, lookupds) -> tuple[list[dict], list[str]]:
        answers, errors = self._gather("nsqlookupd", lookupds,
                                       lambda a: self._get(f"http://{a}/lookup?topic={_q(topic)}"))
        producers: dict[str, dict] = {}
        for _, doc in answers:
            for raw in doc.get("producers") or ():
                p = _producer(raw.get("version", ""), raw.get("broadcast_address", ""), raw.get("hostname", ""),
                              raw.get("http_port", 0), raw.get("tcp_port", 0), raw.get("remote_address", ""))
                producers.setdefault(http_address(p), p)
        return list(producers.values()), errors

    # ---- nsqd ----------------------------------------------------------------------------------------------

    def _nsqd_producer(self, address: str, topic: str | None = None) -> dict | None:
        """One nsqd as a producer (its /info and its topic list); None when ``topic`` is given and it has not."""
        query = "format=json&include_clients=false" + (f"&topic={_q(topic)}" if topic is not None else "")
        stats = self._get(f"http://{address}/stats?{query}")
        names = [t.get("topic_name", "") for t in stats.get("topics") or ()]
        if topic is not None and topic not in names:
            return None
        info = self._get(f"http://{address}/info")
        host, _, port = address.rpartition(":")
        return _producer(info.get("version", ""), info.get("broadcast_address") or host.strip("[]"),
                         info.get("hostname") or host.strip("[]"),
                         info.get("http_port") or int(port), info.get("tcp_port", 0),
                         topics=[{"topic": n, "tombstoned": False} for n in names])

    def nsqd_topics(self, nsqds) -> tuple[list[str], list[str]]:
        answers, errors = self._gather("nsqd", nsqds, lambda a: self._get(f"http://{a}/stats?format=json"
                                                                          "&include_clients=false"))
        return sorted({t.get("topic_name", "") for _, doc in answers for t in doc.get("topics") or ()}), errors

    def nsqd_producers(self, nsqds, topic: str | None = None) -> tuple[list[dict], list[str]]:
        answers, errors = self._gather("nsqd", nsqds, lambda a: self._nsqd_producer(a, topic))
        return [p for _, p in answers if p is not None], errors

    def producers(self, lookupds, nsqds) -> tuple[list[dict], list[str]]:
        return self.lookupd_producers(lookupds) if lookupds else self.nsqd_producers(nsqds)

    def topic_producers(self, topic: str, lookupds, nsqds) -> tuple[list[dict], list[str]]:
        if lookupds:
            return self.lookupd_topic_producers(topic, lookupds)
        return self.nsqd_producers(nsqds, topic)

    def nsqd_stats(self, producers, topic: str = "", channel: str = "", include_clients: bool = True):
        """(per-node topic rows sorted by hostname, {channel key: ChannelTotal}, warnings). The key is the channel
        name when ``topic`` is given, else ``topic:channel``."""
        query = "format=json"
        if topic:
            query += f"&topic={_q(topic)}" + (f"&channel={_q(channel)}" if channel else "")
        if not include_clients:
            query += "&include_clients=false"
        answers, errors = self._gather("nsqd", producers,
                                       lambda p: self._get(f"http://{http_address(p)}/stats?{query}"))
        rows, channels = [], {}
        for p, doc in answers:
            for raw in doc.get("topics") or ():
                row = topic_row(raw, http_address(p), p["hostname"])
                if topic and row["topic_name"] != topic:
                    continue
                rows.append(row)
                for ch in row["channels"]:
                    key = ch["channel_name"] if topic else f"{row['topic_name']}:{ch['channel_name']}"
                    total = channels.get(key)
                    if total is None:
                        total = channels[key] = ChannelTotal(row["topic_name"], ch["channel_name"], ch["node"])
                    total.add(ch)
        rows.sort(key=lambda r: r["hostname"])
        return rows, channels, errors

    # ---- actions -------------------------------------------------------------------------------------------

    def tombstone_topic_producer(self, topic: str, node: str, lookupds) -> list[str]:
        errors = self._post_each(f"http://{a}/topic/tombstone?topic={_q(topic)}&node={_q(node)}" for a in lookupds)
        producers, more = self.nsqd_producers([node])  # AllFailed (a down node): 502, as in Go
        errors += more
        return errors + self._post_each(f"http://{http_address(p)}/topic/delete?topic={_q(topic)}"
                                        for p in producers)

    def create_topic_channel(self, topic: str, channel: str, lookupds) -> list[str]:
        errors = self._post_each(f"http://{a}/topic/create?topic={_q(topic)}" for a in lookupds)
        if channel:
            qs = f"topic={_q(topic)}&channel={_q(channel)}"
            errors += self._post_each(f"http://{a}/channel/create?{qs}" for a in lookupds)
            producers, more = self.lookupd_topic_producers(topic, lookupds)
            errors += more
            errors += self._post_each(f"http://{http_address(p)}/channel/create?{qs}" for p in producers)
        return errors

    def delete_topic(self, topic: str, lookupds, nsqds) -> list[str]:
        producers, errors = self.topic_producers(topic, lookupds, nsqds)  # before they forget it
        qs = f"topic={_q(topic)}"
        errors += self._post_each(f"http://{a}/topic/delete?{qs}" for a in lookupds)
        return errors + self._post_each(f"http://{http_address(p)}/topic/delete?{qs}" for p in producers)

    def delete_channel(self, topic: str, channel: str, lookupds, nsqds) -> list[str]:
        producers, errors = self.topic_producers(topic, lookupds, nsqds)
        qs = f"topic={_q(topic)}&channel={_q(channel)}"
        errors += self._post_each(f"http://{a}/channel/delete?{qs}" for a in lookupds)
        return errors + self._post_each(f"http://{http_address(p)}/channel/delete?{qs}" for p in producers)

    def producer_action(self, topic: str, channel: str, what: str, lookupds, nsqds) -> list[str]:
        """``what``: pause, unpause or empty, of the topic (``channel`` "") or the channel, on every producer."""
        producers, errors = self.topic_producers(topic, lookupds, nsqds)
        path = f"channel/{what}?topic={_q(topic)}&channel={_q(channel)}" if channel else \
            f"topic/{what}?topic={_q(topic)}"
        return errors + self._post_each(f"http://{http_address(p)}/{path}" for p in producers)
