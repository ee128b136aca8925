"""Session ids out of the access log.

A session id is the whole of a session's credential without ``--token`` (and,
with one, all that tells one session of the token's holders from another), and
it travels in the URL path (``/sessions/{id}/run``). uvicorn's access log
writes every path at the default ``info`` level, so anyone who could read the
server's log could run in, fork or delete every session it named (thirtieth
red-team round). ``redact_session_ids`` installs a filter on uvicorn's access
logger that writes ``/sessions/<id>`` in their place; the method, the rest of
the path and the status stay, which is what the log is read for.
"""

from __future__ import annotations

import logging
import re

__all__ = ["ACCESS_LOGGER", "SessionIdRedaction", "redact_session_ids"]

ACCESS_LOGGER = "uvicorn.access"
_SESSION_ID = re.compile(r"(/sessions/)[^/?#\s]+")
_PLACEHOLDER = r"\1<id>"


class SessionIdRedaction(logging.Filter):
    """Rewrites the session ids in an access-log record's arguments (the path is one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _SESSION_ID.sub(_PLACEHOLDER, arg) if isinstance(arg, str) else arg
                for arg in record.args
            )
        elif isinstance(record.msg, str):
            record.msg = _SESSION_ID.sub(_PLACEHOLDER, record.msg)
        return True


def redact_session_ids() -> None:
    """Install ``SessionIdRedaction`` on uvicorn's access logger, once per process."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(each, SessionIdRedaction) for each in logger.filters):
        logger.addFilter(SessionIdRedaction())
