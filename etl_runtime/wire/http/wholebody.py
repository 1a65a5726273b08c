"""Request bodies received whole, into the ``bytes`` the app gets: one copy, not three.

uvicorn (0.54, httptools) hands an app a request body as it comes: every
piece the parser cuts is appended to a ``bytearray`` (a copy), ``receive()``
makes ``bytes`` of what has gathered (a second copy), and an app that needs
the body whole joins those messages (a third). An inline transformer gives
the function the object whole, so for it these were pure cost: py-spy
``--native`` on a default transformer answering identity 1 MiB at 64 in flight
(``bench/anchor_transformer.py``) put 28% of the server process's samples in
``memcpy`` under ``on_body``, ``receive`` and the join, about as much as its
``write`` to the socket (``git show f8a3f49:docs/benchmarks.md``,
"Request bodies received whole").

``protocol(wants)`` subclasses uvicorn's httptools protocol. For a
request that ``wants(scope)`` accepts, with one ``Content-Length`` from
``MIN_BYTES`` to ``MAX_BYTES`` and no ``Transfer-Encoding``, the parser's
pieces are copied straight into one new ``bytes`` object of that length, and
``receive()`` returns it once, whole, with ``more_body`` false (uvicorn's
``bytes(body)`` of a ``bytes`` is that object). Every other request, and a
body the client did not finish (the app gets ``http.disconnect``, never a
short body), goes as uvicorn does it.

Writing into a ``bytes``: ``PyBytes_FromStringAndSize(NULL, n)`` is the C
API's way to make a bytes object to fill before anyone else sees it (its
hash is computed on first use, after the fill); ctypes reaches it because
Python has no other way to receive into an immutable buffer. Handing the
function a ``bytearray`` instead would change what user code receives (not
hashable, not ``bytes``); ``bytes(bytearray)`` is the copy this avoids.
Sizes under ``MIN_BYTES`` come in one or two pieces anyway; over
``MAX_BYTES`` the buffer is not made ahead of the data (the ordinary path
grows with what arrives). A client that announces a length and stalls
holds untouched, unmapped pages, not memory.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable
from typing import Any, ClassVar, cast

MIN_BYTES = 64 << 10
MAX_BYTES = 64 << 20

Wants = Callable[[dict[str, Any]], bool]

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_bytes_address = ctypes.pythonapi.PyBytes_AsString
_bytes_address.restype = ctypes.c_void_p
_bytes_address.argtypes = [ctypes.py_object]


class Whole:
    """A new ``bytes`` of ``size`` bytes, filled in order; ``take()`` when full."""

    __slots__ = ("data", "view", "filled")

    def __init__(self, size: int) -> None:
        if size < 2:  # 0 and 1 byte are shared singletons: never written into
            raise ValueError(f"a whole body is at least 2 bytes, not {size}")
        self.data: bytes = _new_bytes(None, size)
        buffer = (ctypes.c_char * size).from_address(_bytes_address(self.data))
        self.view: memoryview | None = memoryview(buffer).cast("B")
        self.filled = 0

    def add(self, piece: bytes) -> None:
        assert self.view is not None
        end = self.filled + len(piece)
        if end > len(self.data):  # the parser keeps to Content-Length; never past it
            raise ValueError("body longer than its Content-Length")
        self.view[self.filled : end] = piece
        self.filled = end

    def take(self) -> bytes | None:
        """The body, if every byte came; None otherwise. No more writes after this."""
        if self.view is not None:
            self.view.release()
            self.view = None
        return self.data if self.filled == len(self.data) else None


def announced_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The one ``Content-Length`` of a request without ``Transfer-Encoding``, else None."""
    length = None
    for name, value in headers:
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif name == b"transfer-encoding":
            return None
    return length


class _WholeBody(asyncio.Protocol):
    """Mixed in before uvicorn's ``HttpToolsProtocol`` (see the module's docstring)."""

    wants: ClassVar[Wants]
    _whole: Whole | None = None

    def on_headers_complete(self) -> None:
        me = cast(Any, self)
        super_ = cast(Any, super())
        super_.on_headers_complete()
        self._whole = None
        if me.parser.should_upgrade():
            return
        size = announced_length(me.scope["headers"])
        if size is not None and MIN_BYTES <= size <= MAX_BYTES and type(self).wants(me.scope):
            self._whole = Whole(size)

    def on_body(self, body: bytes) -> None:
        whole = self._whole
        if whole is None:
            cast(Any, super()).on_body(body)
        elif not cast(Any, self).cycle.response_complete:  # answered already: dropped
            whole.add(body)

    def on_message_complete(self) -> None:
        whole, self._whole = self._whole, None
        cycle = cast(Any, self).cycle
        if whole is not None and not cycle.response_complete:
            data = whole.take()
            if data is None:  # the parser ended the message short: never a short body
                cast(Any, self).transport.close()
                return
            cycle.body = data  # receive(): bytes(data) is data
        cast(Any, super()).on_message_complete()


def protocol(wants: Wants) -> type[asyncio.Protocol] | str:
    """uvicorn's ``http=``: its httptools protocol, with bodies that ``wants`` received whole.

    Without httptools, ``"auto"`` (uvicorn's h11 protocol, unchanged: its body
    handling differs, and it is the slow path anyway).
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"
    attrs = {"wants": staticmethod(wants)}
    return cast(
        type[asyncio.Protocol], type("WholeBodyHttpTools", (_WholeBody, HttpToolsProtocol), attrs)
    )
