"""Counters behind ``GET /stats`` and the recent log lines behind ``GET /logs``."""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

LAST_ERRORS = 20
LOG_LINES = 2000


@dataclass
class Stats:
    objects: int = 0
    samples: int = 0
    skipped: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    # Seconds objects/shards held a worker: first input to last output (``/metrics``).
    transform_seconds: float = 0.0
    last_errors: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=LAST_ERRORS))

    def error(self, obj: str, sample: str | None, message: str) -> None:
        """Count a failed object or sample and remember it."""
        self.errors += 1
        self.last_errors.append(
            {"time": time.time(), "object": obj, "sample": sample, "error": message}
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "objects": self.objects,
            "samples": self.samples,
            "skipped": self.skipped,
            "errors": self.errors,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "last_errors": list(self.last_errors),
        }


class LogBuffer(logging.Handler):
    """The last ``LOG_LINES`` lines: the server's log records and workers' output."""

    def __init__(self, maxlen: int = LOG_LINES) -> None:
        super().__init__()
        self.lines: deque[str] = deque(maxlen=maxlen)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # never let logging break a request
            self.handleError(record)

    def worker_output(self, pid: int, text: str) -> None:
        """Lines the user code printed in worker ``pid``; also echoed to stderr."""
        for line in text.splitlines():
            self.lines.append(f"[worker {pid}] {line}")
        sys.stderr.write(text)

    def tail(self, n: int) -> str:
        if n <= 0:
            return ""
        lines = list(self.lines)[-n:]
        return "\n".join(lines) + ("\n" if lines else "")
