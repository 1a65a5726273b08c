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

    def totals(self) -> Stats:
        """The whole transformer's counters (with one server process, these)."""
        return self

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
    """The last ``LOG_LINES`` lines: the server's log records and workers' output.

    With several server processes (``board``), each writes its lines to its
    ring on the board, and ``/logs`` merges them all, whichever server answers."""

    def __init__(self, maxlen: int = LOG_LINES, board: Board | None = None, ring: int = 0) -> None:
        """``ring``: this process's log ring on ``board`` (its server slot)."""
        super().__init__()
        self.lines: deque[str] = deque(maxlen=maxlen)
        self.board = board
        self.ring = ring
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def _add(self, line: str) -> None:
        assert self.lock is not None  # made by Handler.__init__
        with self.lock:  # the threads of this process write one ring (an RLock: emit holds it)
            if self.board is not None:
                self.board.append_log(self.ring, line)
            else:
                self.lines.append(line)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._add(self.format(record))
        except Exception:  # never let logging break a request
            self.handleError(record)

    def worker_output(self, pid: int, text: str) -> None:
        """Lines the user code printed in worker ``pid``; also echoed to stderr."""
        for line in text.splitlines():
            self._add(f"[worker {pid}] {line}")
        sys.stderr.write(text)

    def tail(self, n: int) -> str:
        if n <= 0:
            return ""
        source = self.board.log_lines() if self.board is not None else list(self.lines)
        lines = source[-n:]
        return "\n".join(lines) + ("\n" if lines else "")


NUMERIC = ("objects", "samples", "skipped", "errors", "bytes_in", "bytes_out", "transform_seconds")
_FATAL_BYTES = 4096
_ERRORS_BYTES = 8192
_SLOT = 8 * (1 + len(NUMERIC)) + _ERRORS_BYTES  # ready flag, counters, last errors (JSON)
_LOG_BYTES = 128 * 1024  # each server's log ring
_NOT_READY, _READY, _RESTARTING = 0.0, 1.0, 2.0


class Board:
    """Shared memory of the server processes of one transformer (``--servers N``).

    An anonymous ``MAP_SHARED`` mapping made before the servers are forked: one
    slot per server that only that server writes (ready flag, counters, its last
    errors as JSON), read by all, so no locks; the first fatal start-up
    reason, which the parent prints last before it exits; and a ring of the
    servers' last log lines, one ring per server (and one for the supervisor).
    A slot outlives its server: a replacement (``servers``) keeps counting.
    """

    def __init__(self, servers: int) -> None:
        import mmap

        self.servers = servers
        self.mem = mmap.mmap(-1, _FATAL_BYTES + servers * _SLOT)
        # a log ring per server and one for the supervisor: bytes written, then the ring
        self.log_mem = mmap.mmap(-1, (servers + 1) * (8 + _LOG_BYTES))

    def _numbers(self, slot: int) -> memoryview[float]:
        start = _FATAL_BYTES + slot * _SLOT
        return memoryview(self.mem)[start : start + 8 * (1 + len(NUMERIC))].cast("d")

    def _errors_at(self, slot: int) -> int:
        return _FATAL_BYTES + slot * _SLOT + 8 * (1 + len(NUMERIC))

    def set_ready(self, slot: int, ready: bool) -> None:
        self._numbers(slot)[0] = _READY if ready else _NOT_READY

    def set_restarting(self, slot: int) -> None:
        """A new server is loading in ``slot``; it takes no connection until ready."""
        self._numbers(slot)[0] = _RESTARTING

    def all_ready(self) -> bool:
        """Every server that takes connections is ready (one at least)."""
        states = [self._numbers(s)[0] for s in range(self.servers)]
        return _READY in states and all(v in (_READY, _RESTARTING) for v in states)

    def append_log(self, ring: int, line: str) -> None:
        """Add ``line`` to log ring ``ring`` (a server's slot, or ``servers`` for the
        supervisor): one writer per ring, so no lock (no semaphore needs /dev/shm)."""
        data = f"{time.time_ns()} {line}\n".encode("utf-8", "replace")[-_LOG_BYTES:]
        base = ring * (8 + _LOG_BYTES)
        mem = self.log_mem
        total = int.from_bytes(mem[base : base + 8], "little")
        at = total % _LOG_BYTES
        first = min(len(data), _LOG_BYTES - at)
        mem[base + 8 + at : base + 8 + at + first] = data[:first]
        if first < len(data):
            mem[base + 8 : base + 8 + len(data) - first] = data[first:]
        mem[base : base + 8] = (total + len(data)).to_bytes(8, "little")

    def log_lines(self) -> list[str]:
        """The last ``LOG_LINES`` lines of all rings, in the order they were written."""
        stamped: list[tuple[int, str]] = []
        for ring in range(self.servers + 1):
            base = ring * (8 + _LOG_BYTES)
            mem = self.log_mem
            total = int.from_bytes(mem[base : base + 8], "little")
            if total <= _LOG_BYTES:
                data = bytes(mem[base + 8 : base + 8 + total])
            else:
                at = total % _LOG_BYTES
                data = bytes(mem[base + 8 + at : base + 8 + _LOG_BYTES])
                data += bytes(mem[base + 8 : base + 8 + at])
            lines = data.decode("utf-8", "replace").split("\n")
            if total > _LOG_BYTES:
                lines = lines[1:]  # the oldest line was partly overwritten
            for entry in lines:
                stamp, _, line = entry.partition(" ")
                if stamp.isdigit():
                    stamped.append((int(stamp), line))
        stamped.sort(key=lambda e: e[0])
        return [line for _, line in stamped[-LOG_LINES:]]

    def set_fatal(self, reason: str) -> None:
        data = reason.encode("utf-8", "replace")[: _FATAL_BYTES - 1]
        if self.mem[0] == 0:  # the first reason wins
            self.mem[1 : 1 + len(data)] = data
            self.mem[0] = 1

    def fatal(self) -> str | None:
        if self.mem[0] == 0:
            return None
        return bytes(self.mem[1:_FATAL_BYTES]).rstrip(b"\0").decode("utf-8", "replace")

    def write_errors(self, slot: int, errors: list[dict[str, Any]]) -> None:
        import json

        while True:
            data = json.dumps(errors).encode()
            if len(data) < _ERRORS_BYTES - 4 or not errors:
                break
            errors = errors[1:]
        at = self._errors_at(slot)
        self.mem[at : at + 4] = len(data).to_bytes(4, "little")
        self.mem[at + 4 : at + 4 + len(data)] = data

    def errors(self, slot: int) -> list[dict[str, Any]]:
        import json

        at = self._errors_at(slot)
        size = int.from_bytes(self.mem[at : at + 4], "little")
        if not size:
            return []
        try:
            errors = json.loads(bytes(self.mem[at + 4 : at + 4 + size]))
        except ValueError:
            return []
        return errors if isinstance(errors, list) else []


class SharedStats(Stats):
    """``Stats`` of one of several server processes: its counters live in its
    ``Board`` slot, so ``to_dict`` (``/stats``) and ``totals`` (``/metrics``)
    report the whole transformer, whichever server answers."""

    def __init__(self, board: Board, slot: int) -> None:
        self.board = board
        self.slot = slot
        self.numbers = board._numbers(slot)
        # a replaced server's errors stay: its successor goes on from them
        self.last_errors = deque(board.errors(slot), maxlen=LAST_ERRORS)

    def error(self, obj: str, sample: str | None, message: str) -> None:
        super().error(obj, sample, message)
        self.board.write_errors(self.slot, list(self.last_errors))

    def totals(self) -> Stats:
        out = Stats()
        for s in range(self.board.servers):
            numbers = self.board._numbers(s)
            for i, name in enumerate(NUMERIC, start=1):
                setattr(out, name, getattr(out, name) + numbers[i])
        for name in NUMERIC[:-1]:
            setattr(out, name, int(getattr(out, name)))
        errors = [e for s in range(self.board.servers) for e in self.board.errors(s)]
        errors.sort(key=lambda e: e.get("time") or 0)
        out.last_errors.extend(errors)
        return out

    def to_dict(self) -> dict[str, Any]:
        return self.totals().to_dict()


def _counter(index: int) -> property:
    def get(self: SharedStats) -> float:
        return self.numbers[index]

    def set(self: SharedStats, value: float) -> None:
        self.numbers[index] = value

    return property(get, set)


for _i, _name in enumerate(NUMERIC, start=1):
    setattr(SharedStats, _name, _counter(_i))
