"""Logging set-up: plain text or one JSON object per line (``--log-format json``).

Envelope events log id, from, to, tier and outcome as structured fields; message text is never
logged at info level.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final

from broker.text import escaped

EVENT_FIELDS: Final = (
    "envelope",
    "from",
    "to",
    "agent",
    "tier",
    "outcome",
    "session",
    "url",
    "data_dir",
    "event",
    "credential",
    "listener",
    "cause",
)
# color_message: uvicorn's copy of the message with terminal colour codes
_STANDARD: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extras = [f"{k}={_plain(record.__dict__[k])}" for k in EVENT_FIELDS if k in record.__dict__]
        return f"{base} {' '.join(extras)}" if extras else base


def configure(log_format: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("mcp").setLevel(logging.WARNING)


class _Stderr(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (a command run in-process, as
    tests do, may have replaced it since)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except (OSError, ValueError):
            self.handleError(record)


def audit_lines(name: str = "relay.credentials") -> None:
    """JSON lines on stderr for the audit logger ``name`` in a command that configures no logging
    (``relay credentials``, ``relay setup claude-code``): one handler, whatever the calls."""
    logger = logging.getLogger(name)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _plain(value: object) -> str:
    """One token per field: values with spaces, quotes or control characters are quoted and escaped,
    so a field that came from a client cannot forge another log line or field."""
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in " \"'=\\"):
        return text
    return '"' + escaped(text).replace('"', '\\"') + '"'
