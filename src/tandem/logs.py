"""Structured, quiet-by-default logging: one line per event, `key=value` pairs after the message."""

from __future__ import annotations

import logging
import sys
import time

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        msg = record.getMessage()
        extras = " ".join(f"{k}={v!r}" for k, v in record.__dict__.items() if k not in _RESERVED)
        line = f"{ts}.{int(record.msecs):03d}Z {record.levelname.lower():7} {record.name}: {msg}"
        if extras:
            line += " " + extras
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str = "warning") -> None:
    root = logging.getLogger("tandem")
    root.setLevel(getattr(logging, level.upper(), logging.WARNING))
    if not any(getattr(h, "_tandem", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(KeyValueFormatter())
        handler._tandem = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.propagate = False
