"""A message handed to a consumer's handler, with the replies nsqd accepts for it: FIN, REQ and TOUCH.

The replies may be sent from any thread (a sync handler runs in a worker thread): they are forwarded to the
consumer's event loop, which owns the connection. A message is answered once; later FIN/REQ calls are ignored.
With `disable_auto_response()` the handler takes over answering it (go-nsq's manual mode); otherwise the
consumer FINs it when the handler returns and REQs it when the handler raises or returns False.
"""

from __future__ import annotations

__all__ = ["Message"]


class Message:
    __slots__ = ("id", "body", "timestamp", "attempts", "conn", "_consumer", "responded", "auto_response")

    def __init__(self, raw, conn, consumer):
        self.id: bytes = raw.id                # 16 ASCII hex bytes
        self.body: bytes = raw.body
        self.timestamp: int = raw.timestamp    # ns since the epoch, when nsqd accepted the PUB
        self.attempts: int = raw.attempts      # 1 on the first delivery
        self.conn = conn
        self._consumer = consumer
        self.responded = False
        self.auto_response = True

    def __repr__(self) -> str:
        return f"<Message {self.id.decode()} attempts={self.attempts} {len(self.body)} bytes>"

    @property
    def nsqd_address(self) -> str:
        return self.conn.address

    def disable_auto_response(self) -> None:
        self.auto_response = False

    def fin(self) -> None:
        self.auto_response = False   # now, in the caller's thread: the consumer must not answer it as well
        self._consumer._respond(self, "fin")

    def req(self, delay: float | None = None, backoff: bool = True) -> None:
        """Requeue; `delay` in seconds (None: default_requeue_delay x attempts, capped at max_requeue_delay).
        backoff=False requeues without slowing the consumer down (go-nsq's RequeueWithoutBackoff)."""
        self.auto_response = False
        self._consumer._respond(self, "req", delay, backoff)

    def touch(self) -> None:
        """Ask nsqd for another msg_timeout before this message times out (never sent automatically)."""
        self._consumer._respond(self, "touch")

    # pynsq's names, for code moving over from it.
    finish = fin
    requeue = req
