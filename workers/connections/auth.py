"""AUTH (spec 10.2): asking the auth servers without stalling the worker's loop, and what their reply allows.

Theory of operation: a query is a blocking HTTP request (urllib), so it runs on a small thread pool of the
worker (threads are started on first use, after fork). The session that asked is *held* meanwhile (as for a
publish waiting for ring room: its socket leaves the pump, the commands parsed after it wait in order), so the
loop keeps serving every other client. The finished query is put on a queue and the loop is woken through a
pipe registered as a reader; the callback then runs in the loop thread, which is the only thread that touches
sessions. ``AuthState`` is the validated reply: its TTL is kept as an absolute CLOCK_MONOTONIC time, which is
the same clock in every process of the machine, so the state moves with a consumer handed to a topic's owner.
"""
import json
import os
import queue
import random
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from nsqpy.protocol.errors import AuthDisabled, AuthFailed, AuthFirst, Invalid, Unauthorized, go_quote
from nsqpy.protocol.frames import response_frame

PERMISSIONS = ("subscribe", "publish")
THREADS = 4
ACCEPT = "application/vnd.nsq; version=1.0"


class AuthServerError(Exception):
    """No auth server gave a valid reply (the client sees E_AUTH_FAILED; the details go to the log)."""


class AuthState:
    def __init__(self, identity, identity_url, expires, authorizations):
        self.identity = identity
        self.identity_url = identity_url
        self.expires = expires  # time.monotonic() after which the next SUB/PUB check asks again
        self.raw = authorizations  # [{"topic", "channels", "permissions"}], as received
        self._rules = [(re.compile(a["topic"]), [re.compile(c) for c in a["channels"]], set(a["permissions"]))
                       for a in authorizations]

    @classmethod
    def from_reply(cls, body, now=None):
        try:
            data = json.loads(body)
            ttl = data["ttl"]
            auths = data.get("authorizations") or []
            if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
                raise AuthServerError(f"invalid TTL {ttl!r}")
            for a in auths:
                for p in a.get("permissions") or []:
                    if p not in PERMISSIONS:
                        raise AuthServerError(f"unknown permission {p!r}")
            clean = [{"topic": str(a.get("topic", "")), "channels": [str(c) for c in a.get("channels") or []],
                      "permissions": list(a.get("permissions") or [])} for a in auths]
            state = cls(str(data.get("identity", "")), str(data.get("identity_url", "")),
                        (time.monotonic() if now is None else now) + ttl, clean)
        except AuthServerError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, re.error) as e:
            raise AuthServerError(f"invalid auth reply: {e!r}") from None
        return state

    def blob(self):
        return {"identity": self.identity, "identity_url": self.identity_url, "expires": self.expires,
                "authorizations": self.raw}

    @classmethod
    def from_blob(cls, d):
        return cls(d["identity"], d["identity_url"], d["expires"], d["authorizations"])

    @property
    def permission_count(self):
        return len(self.raw)

    def expired(self):
        return time.monotonic() >= self.expires

    def allows(self, topic, channel):
        """nsqd's IsAllowed: SUB needs 'subscribe' (channel given), PUB 'publish' and a channel rule matching "";
        the expressions are unanchored (a search, as Go's MatchString)."""
        need = "subscribe" if channel else "publish"
        for topic_re, channel_res, perms in self._rules:
            if need in perms and topic_re.search(topic) and any(c.search(channel) for c in channel_res):
                return True
        return False

    def stats(self):
        return {"authed": True, "auth_identity": self.identity, "auth_identity_url": self.identity_url}


def endpoint(address):
    return address if "://" in address else f"http://{address}/auth"


class AuthClient:
    """One per worker process: the configured servers, the thread pool and the loop's wake-up pipe."""

    def __init__(self, loop, opts, log):
        self.loop, self.log = loop, log
        self.urls = [endpoint(a) for a in opts.auth_http_address]
        self.method = opts.auth_http_request_method
        self.timeout = max(opts.http_client_request_timeout, opts.http_client_connect_timeout) / 1e9
        self.ssl = ssl.create_default_context(cafile=opts.tls_root_ca_file or None)
        self._pool = None
        self._done = queue.SimpleQueue()
        self._rfd, self._wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        loop.add_reader(self._rfd, self._on_wake)
        loop.keep_on_error(self._rfd)

    def query(self, remote_ip, tls, secret, common_name, callback):
        """callback(AuthState or AuthServerError) runs later in the loop, never from inside this call."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="auth")
        params = {"remote_ip": remote_ip, "tls": "true" if tls else "false", "secret": secret,
                  "common_name": common_name}
        self._pool.submit(self._run, params, callback)

    def _run(self, params, callback):
        try:
            result = self._ask_all(params)
        except Exception as e:  # noqa: every failure is the client's E_AUTH_FAILED
            result = e if isinstance(e, AuthServerError) else AuthServerError(repr(e))
        self._done.put((callback, result))
        try:
            os.write(self._wfd, b"x")
        except BlockingIOError:
            pass  # the pipe is full: the loop is woken anyway

    def _ask_all(self, params):
        errors = []
        start = random.randrange(len(self.urls))
        for url in self.urls[start:] + self.urls[:start]:
            try:
                return AuthState.from_reply(self._ask(url, params))
            except Exception as e:
                errors.append(f"{url}: {e}")
        raise AuthServerError("; ".join(errors))

    def _ask(self, url, params):
        headers = {"Accept": ACCEPT}
        if self.method == "post":
            data = json.dumps({k: [v] for k, v in params.items()}).encode()
            headers["Content-Type"] = "application/json"
            req = urllib.request.Request(url, data=data, headers=headers, method="POST")
        else:
            sep = "&" if "?" in url else "?"
            req = urllib.request.Request(url + sep + urllib.parse.urlencode(params), headers=headers)
        ctx = self.ssl if url.startswith("https:") else None
        with urllib.request.urlopen(req, timeout=self.timeout, context=ctx) as resp:
            if resp.status != 200:
                raise AuthServerError(f"got {resp.status}")
            return resp.read(1 << 20)

    def _on_wake(self):
        try:
            while os.read(self._rfd, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                callback, result = self._done.get_nowait()
            except queue.Empty:
                return
            try:
                callback(result)
            except Exception as e:  # one session's failure must not stop the others' callbacks
                self.log.error(f"auth callback failed: {e!r}")


_client = None


def auth_client(worker):
    """This worker process's AuthClient (made on first use, after fork)."""
    global _client
    if _client is None:
        _client = AuthClient(worker.loop, worker.opts, worker.log)
    return _client


class SessionAuth:
    """AUTH and nsqd's CheckAuth for ``nsqpy.workers.domain.session.Session`` (a mixin: it uses the session's hold/release,
    fail_held and write). SUB/PUB/MPUB/DPUB handlers return AUTH_PENDING (workers/domain/session.py) when
    ``_authorized`` has asked the auth server again because the cached state expired."""

    def on_auth(self, cmd):
        if self.auth is not None and self.auth.permission_count:
            raise Invalid("AUTH already set")
        if not self.worker.server_settings.auth_required:
            raise AuthDisabled("AUTH disabled")
        self.auth_secret = cmd.secret
        self._ask_auth_server(reply=True)

    def _ask_auth_server(self, reply):
        """Hold the session until the auth server answers (other clients are served meanwhile)."""
        self.hold()
        secret = self.auth_secret.decode("utf-8", "replace")
        auth_client(self.worker).query(self.remote[0], self.settings.tls_v1, secret, self.common_name,
                                       lambda result: self._auth_answered(result, reply))

    def _auth_answered(self, result, reply):
        if self.closed:
            return
        if isinstance(result, AuthServerError):
            self.worker.log.warn(f"PROTOCOL(V2): [{self.remote_text}] AUTH failed - {result}")
            self.fail_held(AuthFailed("AUTH failed"))
            return
        self.auth = result
        self.stats_extra = {**(self.stats_extra or {}), **result.stats()}
        if reply:
            if not result.permission_count:
                self.fail_held(Unauthorized("AUTH no authorizations found"))
                return
            body = {"identity": result.identity, "identity_url": result.identity_url,
                    "permission_count": result.permission_count}
            self.write(response_frame(json.dumps(body, separators=(",", ":")).encode()))
        self.release()  # AUTH's reply sent, or the command that waited for a fresh state is handled again

    def _authorized(self, verb, topic, channel=""):
        """nsqd's CheckAuth (called with auth on); False: the state expired and the auth server is asked again."""
        if self.auth is None or not self.auth.permission_count:
            raise AuthFirst(f"AUTH required before {verb}")
        if self.auth.expired():
            self._ask_auth_server(reply=False)
            return False
        if not self.auth.allows(topic, channel):
            raise Unauthorized(f"AUTH failed for {verb} on {go_quote(topic.encode())} {go_quote(channel.encode())}")
        return True

