"""How object-mode user code is called, and what it may return: one set of rules
for both places that call it, the worker processes (``worker``) and ``--inline``
server threads (``inprocess``).

- ``read_fqn`` / ``open_fqn``: the object by path (``etl_fqn``), a missing file
  is a 404 and an unreadable one a 400, each naming the path;
- ``object_result``: one object through the user's code: a function gets the
  bytes (``call``), an ``ObjectHandler`` (an AIStore ETL class, ``aisclass``)
  the bytes or the path and the object's name;
- ``call``: the function with or without ``etl_args``; what it raises becomes a
  ``TransformError`` with the traceback's tail;
- ``result_of`` / ``chunk_of``: a result is bytes or str (one body), or an
  iterable of bytes/str chunks; anything else is a ``BadResult`` naming its type;
- ``LineWriter``: ``sys.stdout`` for user code, complete lines to ``emit``.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

from etl_runtime.core.errors import (
    BadRequest,
    BadResult,
    ObjectNotFound,
    SluiceError,
    TransformError,
    traceback_tail,
)

Chunk = bytes | bytearray | memoryview


def read_fqn(fqn: str) -> bytes:
    with open_fqn(fqn) as f:
        try:
            return f.read()
        except OSError as e:
            raise BadRequest(f"etl_fqn: cannot read the object's file: {_why(e)}") from None


def open_fqn(fqn: str) -> BinaryIO:
    try:
        return open(fqn, "rb")
    except FileNotFoundError:
        raise ObjectNotFound("etl_fqn: the object's file is gone (no such file)") from None
    except OSError as e:
        raise BadRequest(f"etl_fqn: cannot read the object's file: {_why(e)}") from None


def _why(e: OSError) -> str:
    """An OSError's reason without its file name: error bodies never carry a path."""
    return e.strerror or type(e).__name__


class ObjectHandler:
    """User code that wants more than the bytes: the object's name, and the file
    itself when the target sent its path (``etl_fqn``) rather than its bytes."""

    def handle(self, data: bytes | None, fqn: str | None, obj: str, args: str | None) -> Any:
        """The result for one object: ``data`` is its bytes, or None with ``fqn``."""
        raise NotImplementedError

    def __call__(self, data: bytes, args: str | None = None) -> Any:
        return self.handle(data, None, "", args)


def object_result(
    fn: Callable[..., Any],
    with_args: bool,
    data: bytes | None,
    fqn: str | None,
    obj: str,
    args: str | None,
) -> Chunk | Any:
    """``result_of`` the user's code on one object (its bytes, or its file ``fqn``)."""
    if isinstance(fn, ObjectHandler):
        return result_of(fn.handle(data, fqn, obj, args))
    if data is None:
        data = read_fqn(fqn or "")
    return result_of(call(fn, with_args, data, args))


def raised(e: BaseException) -> TransformError:
    return TransformError(f"transform raised {type(e).__name__}: {e}", detail=traceback_tail(e))


def call(fn: Callable[..., Any], with_args: bool, data: bytes, args: str | None) -> Any:
    try:
        return fn(data, args) if with_args else fn(data)
    except SluiceError:
        raise
    except Exception as e:
        raise raised(e) from e


def result_of(result: Any) -> Chunk | Any:
    """``result`` as one body (bytes-like) or as the iterable of its chunks."""
    if isinstance(result, str):
        return result.encode("utf-8")
    if isinstance(result, Chunk):
        return result
    if result is None or isinstance(result, dict) or not hasattr(result, "__iter__"):
        raise BadResult(
            f"transform returned {type(result).__name__}; return bytes, str, "
            "or an iterable of bytes chunks"
        )
    return result


def chunk_of(item: Any) -> Chunk:
    if isinstance(item, str):
        return item.encode("utf-8")
    if not isinstance(item, Chunk):
        raise BadResult(f"transform yielded a {type(item).__name__}; yield bytes or str chunks")
    return item


class LineWriter(io.TextIOBase):
    """A text stream that hands complete lines (and, on flush, the rest) to ``emit``."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.buf = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.buf += s
        if "\n" in self.buf:
            lines, _, self.buf = self.buf.rpartition("\n")
            self.emit(lines + "\n")
        return len(s)

    def flush(self) -> None:
        if self.buf:
            text, self.buf = self.buf, ""
            self.emit(text + "\n")


def reseed_numpy() -> None:
    """A fresh seed for numpy's global generator when it was imported before the fork
    (the forker, the zygote, the supervisor of inline servers): else every worker
    or server would draw the same "random" numbers. (``random`` reseeds itself
    after a fork; torch's default seed is fixed anyway.)"""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
