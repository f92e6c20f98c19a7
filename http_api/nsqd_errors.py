"""What nsqd's HTTP resources raise and the content type of its JSON replies: shared by the app
(``nsqpy.http_api.nsqd_app``, which turns the errors into replies in one place) and the resources
(``nsqpy.http_api.nsqd_resources``), so neither imports the other's module for them."""
from __future__ import annotations

__all__ = ["ApiError", "PublishRefused", "NSQ_CONTENT_TYPE", "JSON_TYPE"]

NSQ_CONTENT_TYPE = "nsq; version=1.0"
JSON_TYPE = "application/json; charset=utf-8"


class ApiError(Exception):
    """An nsqd HTTP error: ``status`` and the ``message`` code of its JSON body (``plain``: a text body, as
    /ping's ``NOK - ...``)."""

    def __init__(self, status: int, message: str, plain: bool = False):
        super().__init__(message)
        self.status = status
        self.message = message
        self.plain = plain


class PublishRefused(RuntimeError):
    """``deps.publish`` could not commit the messages (nsqd answers 503 EXITING for any failed PutMessage)."""
