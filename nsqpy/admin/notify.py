"""Admin-action notifications (``--notification-http-endpoint``): each action POSTed as JSON, as Go's nsqadmin
does, without ever holding up the action's reply.

    notifier = Notifier(endpoint, timeout, log)
    notifier.send(admin_action("pause_topic", "t", "", "", request_facts, via=hostname))

Resource handling: one daemon thread per Notifier sends from a bounded queue in order; a full queue (the endpoint
is down or slow and operators keep clicking) drops the newest notification with an ERROR line rather than grow
without bound or block the HTTP thread. A failed POST is one ERROR line, like Go's.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import queue
import threading
import time
import urllib.error
import urllib.request

__all__ = ["Notifier", "RequestFacts", "admin_action", "basic_auth_user"]

QUEUE_SIZE = 1000


@dataclasses.dataclass(frozen=True)
class RequestFacts:
    """What an action's notification and its authorization need to know of the HTTP request."""

    method: str = "GET"
    host: str = ""
    path: str = "/"
    query: str = ""
    remote_addr: str = ""       # "ip:port", as Go's req.RemoteAddr
    user_agent: str = ""
    authorization: str = ""
    https: bool = False         # TLS, or an X-Scheme: https header from a proxy
    acl_user: str = ""          # the value of --acl-http-header


def basic_auth_user(authorization: str) -> str:
    scheme, _, token = authorization.partition(" ")
    if scheme != "Basic" or not token:
        return ""
    try:
        pair = base64.b64decode(token, validate=True).decode("utf-8", "replace")
    except ValueError:
        return ""
    user, sep, _ = pair.partition(":")
    return user if sep else ""


def admin_action(action: str, topic: str, channel: str, node: str, req: RequestFacts, via: str,
                 now: float | None = None) -> dict:
    """Go's AdminAction, field for field (channel, node and user omitted when empty)."""
    url = f"{'https' if req.https else 'http'}://{req.host}{req.path}" + (f"?{req.query}" if req.query else "")
    doc = {"action": action, "topic": topic}
    if channel:
        doc["channel"] = channel
    if node:
        doc["node"] = node
    doc["timestamp"] = int(time.time() if now is None else now)
    user = basic_auth_user(req.authorization)
    if user:
        doc["user"] = user
    doc.update(remote_ip=req.remote_addr, user_agent=req.user_agent, url=url, via=via)
    return doc


class Notifier:
    def __init__(self, endpoint: str, timeout: float, log=None):
        self.endpoint = endpoint
        self.timeout = timeout
        self.log = log
        self._queue: queue.Queue = queue.Queue(QUEUE_SIZE)
        self._thread = None
        self._lock = threading.Lock()

    def send(self, action: dict) -> None:
        if not self.endpoint:
            return
        with self._lock:
            if self._thread is None:  # started on first use: after gunicorn's fork, in the serving process
                self._thread = threading.Thread(target=self._run, name="notifier", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(action)
        except queue.Full:
            self._say(f"failed to POST notification - queue of {QUEUE_SIZE} full, {action['action']} dropped")

    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log.error(line)

    def _run(self) -> None:
        while True:
            action = self._queue.get()
            if self.log is not None:
                self.log.info(f"POSTing notification to {self.endpoint}")
            body = json.dumps(action, separators=(",", ":")).encode()
            request = urllib.request.Request(self.endpoint, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                    resp.read()
            except urllib.error.HTTPError:
                pass  # Go only reports failures to send; any answer is an answer
            except (OSError, ValueError) as e:
                self._say(f"failed to POST notification - {e}")
