"""Session ids out of uvicorn's logs.

A session id is the whole of a session's credential without ``--token`` (and,
with one, all that tells one session of the token's holders from another), and
it travels in the URL path (``/sessions/{id}/run``). uvicorn's access log
writes every path at the default ``info`` level, and its ``trace`` level writes
each request's scope, so anyone who could read the server's log could run in,
fork or delete every session it named (thirtieth red-team round).
``redact_session_ids`` installs a filter on those loggers that writes
``/sessions/<id>`` in their place; the method, the rest of the path and the
status stay, which is what the log is read for. The path is matched as the
router reads it, percent-decoded: ``/%73essions/...`` and ``/sessions%2F...``
reach a session too (the round's review).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

__all__ = ["LOGGERS", "SessionIdRedaction", "redact_session_ids"]

LOGGERS = ("uvicorn.access", "uvicorn.asgi")
"""uvicorn's loggers that write request paths: each request, and (at ``trace``) its scope."""
_SESSION_ID = re.compile(r"(/sessions/)[^/?#\s'\"\\]+")
_PLACEHOLDER = r"\1<id>"


def _redacted(value: object) -> object:
    """``value`` with any session id in it replaced, as text; unchanged if it has none."""
    if not isinstance(value, (str, bytes, dict, list, tuple)):
        return value  # (numbers: the status code, a port)
    text = unquote(value if isinstance(value, str) else str(value))
    return _SESSION_ID.sub(_PLACEHOLDER, text) if _SESSION_ID.search(text) else value


class SessionIdRedaction(logging.Filter):
    """Rewrites the session ids in a log record's message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):  # (the access log's formatter needs a tuple)
            record.args = tuple(_redacted(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _redacted(arg) for key, arg in record.args.items()}
        record.msg = _redacted(record.msg)
        return True


def redact_session_ids() -> None:
    """Install ``SessionIdRedaction`` on uvicorn's loggers, once per process."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(each, SessionIdRedaction) for each in logger.filters):
            logger.addFilter(SessionIdRedaction())
