"""Discovery through nsqlookupd's HTTP `/lookup` (spec 7.4), with the standard library only.

`lookup(address, topic)` is blocking (urllib); the consumer runs it in a thread. Both reply forms are read:
NSQ >= 1.0 replies with the bare JSON and `X-NSQ-Content-Type: nsq; version=1.0`; older lookupds wrap it as
`{status_code, status_txt, data}`. A topic lookupd does not know is a 404, which means "no producers yet".
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["lookup_url", "lookup", "parse_producers", "http_get_json"]

ACCEPT = "application/vnd.nsq; version=1.0"


def lookup_url(address: str, topic: str) -> str:
    """`host:port` or a full URL (its own path and query kept; `/lookup` is the default path) + `topic=`."""
    if "://" not in address:
        address = "http://" + address
    parts = urllib.parse.urlsplit(address)
    path = parts.path if parts.path not in ("", "/") else "/lookup"
    query = urllib.parse.parse_qsl(parts.query)
    query = [(k, v) for k, v in query if k != "topic"] + [("topic", topic)]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, urllib.parse.urlencode(query), ""))


def http_get_json(url: str, timeout: float, headers: dict | None = None) -> dict:
    """GET and decode JSON, unwrapping the pre-1.0 `{status_code, data}` form. Raises urllib's errors."""
    request = urllib.request.Request(url, headers={"Accept": ACCEPT, **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = json.loads(response.read() or b"null")
        modern = response.headers.get("X-NSQ-Content-Type", "").startswith("nsq; version=1.0")
    if not modern and isinstance(body, dict) and "status_code" in body and "data" in body:
        body = body["data"]
    return body


def parse_producers(body) -> list[tuple[str, int]]:
    out = []
    for producer in (body or {}).get("producers") or []:
        host = producer.get("broadcast_address") or producer.get("address")
        port = producer.get("tcp_port")
        if host and port:
            out.append((host, int(port)))
    return out


def lookup(address: str, topic: str, timeout: float = 2.0, auth_secret: str = "") -> list[tuple[str, int]]:
    """The (host, tcp_port) of every nsqd lookupd lists for `topic`; [] when lookupd does not know the topic.
    With an auth secret, go-nsq's `Authorization: Bearer` header goes along (lookupd itself ignores it)."""
    headers = {"Authorization": f"Bearer {auth_secret}"} if auth_secret else None
    try:
        return parse_producers(http_get_json(lookup_url(address, topic), timeout, headers))
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return []
        raise
