"""gunicorn's logger class for the HTTP servers of nsqd and nsqlookupd: every line goes through nsqpy's logger
(NSQ's line format, one write per line, prefixed ``HTTP:``); gunicorn's INFO chatter (booting workers and the
like) is DEBUG, and there is no access log (the apps log what NSQ logs)."""
from __future__ import annotations

import traceback

from gunicorn import glogging

DEBUG, WARNING, ERROR = 1, 3, 4


class NsqGunicornLog(glogging.Logger):
    """Subclass it and set ``nsq_log`` (an ``nsqpy.log.Logger``) and, if the level can change at runtime, a
    ``nsq_level`` with ``.get()`` (nsqd's ``/config/log_level``, shared by its HTTP processes)."""

    nsq_log = None
    nsq_level = None

    def setup(self, cfg):
        pass

    def _say(self, level, msg, args):
        log = self.nsq_log
        if self.nsq_level is not None:
            log.level = self.nsq_level.get()
        if level < log.level:
            return  # before formatting: gunicorn says something at DEBUG for every request
        try:
            text = msg % args if args else str(msg)
        except (TypeError, ValueError):
            text = f"{msg} {args}"
        log.log(level, f"HTTP: {text}")

    def critical(self, msg, *args, **kwargs):
        self._say(ERROR, msg, args)

    def error(self, msg, *args, **kwargs):
        self._say(ERROR, msg, args)

    def exception(self, msg, *args, **kwargs):
        self._say(ERROR, f"{msg}\n{traceback.format_exc().strip()}", args)

    def warning(self, msg, *args, **kwargs):
        # a malformed request is the client's fault, not the server's: Go's net/http logs nothing for it
        self._say(DEBUG if str(msg).startswith("Invalid request") else WARNING, msg, args)

    def info(self, msg, *args, **kwargs):
        self._say(DEBUG, msg, args)

    def debug(self, msg, *args, **kwargs):
        self._say(DEBUG, msg, args)

    def log(self, lvl, msg, *args, **kwargs):
        self._say(DEBUG, msg, args)

    def access(self, resp, req, environ, request_time):
        pass

    def reopen_files(self):
        pass

    def close_on_exec(self):
        pass
