"""Which fast paths built on uvicorn's internals this process has, said once as a server starts.

Each fast path of ``wire/http/`` turns itself off when the internal it needs
is missing, and the server keeps serving the ordinary way:

* ``zerocopy``: plain GETs by ``os.sendfile`` (``zerocopy.py``); needs
  httptools and ``HttpToolsProtocol._start_asgi_task``; ``SLUICE_SENDFILE=0``
  turns it off on purpose.
* ``inprotocol``: small GETs and shares answered inside the protocol
  (``inprotocol.py``); needs ``_start_asgi_task`` and ``STATUS_LINE``.
* ``wholebody``: request bodies received whole (``wholebody.py``); needs
  httptools' protocol and its parser callbacks.
* ``splice``: socket-to-socket relays (``splice.py``); needs ``os.splice``.

On a TLS server (``SLUICE_TLS_CERT``, ``core/tls.py``) ``zerocopy`` and
``splice`` are off: the bytes must go through the TLS transport to be
encrypted (asyncio's and uvloop's use OpenSSL on memory buffers, so kernel TLS
cannot take the socket over). ``inprotocol`` and ``wholebody`` stay on: they
write through the transport and parse what it hands up.

``announce()`` (called by ``connections.server_options``, so by every server)
sets ``sluice_fast_path_enabled{path}`` (``core/metrics.py``) and logs one
warning line naming each path that is off, why, and the uvicorn version.
``tests/wire/test_contracts.py`` checks the internals themselves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from etl_runtime.core import metrics, tls
from etl_runtime.wire.http import inprotocol, splice, zerocopy

log = logging.getLogger("sluice.fastpath")
PATHS = ("zerocopy", "inprotocol", "wholebody", "splice")
TLS_OFF = "TLS: bytes go through the TLS transport to be encrypted"
_announced: dict[str, str | None] | None = None


def _uvicorn() -> str:
    import uvicorn

    return f"uvicorn {uvicorn.__version__}"


def off_reasons(environ: Mapping[str, str] = os.environ) -> dict[str, str | None]:
    """path -> why it is off in this process, or None when it is on."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        no_httptools = f"no httptools ({_uvicorn()} speaks h11)"
        why: dict[str, str | None] = dict.fromkeys(PATHS[:3], no_httptools)
    else:
        missing = f"{_uvicorn()}: HttpToolsProtocol has no _start_asgi_task"
        why = {"zerocopy": None, "inprotocol": None, "wholebody": None}
        if not zerocopy.enabled(environ):
            why["zerocopy"] = f"{zerocopy.ENV}=0"
        elif zerocopy.ZeroCopyHttpToolsProtocol is None:
            why["zerocopy"] = missing
        if not inprotocol.has_hook(HttpToolsProtocol):
            has_task = hasattr(HttpToolsProtocol, "_start_asgi_task")
            why["inprotocol"] = (
                f"{_uvicorn()}: no httptools_impl.STATUS_LINE" if has_task else missing
            )
        callbacks = ("on_headers_complete", "on_body", "on_message_complete")
        lacking = [name for name in callbacks if not hasattr(HttpToolsProtocol, name)]
        if lacking:
            why["wholebody"] = f"{_uvicorn()}: HttpToolsProtocol has no {', '.join(lacking)}"
    why["splice"] = None if splice.available() else "this Python has no os.splice"
    if tls.serving(environ):  # the kernel would send the bytes past the encryption
        for path in ("zerocopy", "splice"):
            why[path] = why[path] or TLS_OFF
    return why


def announce(environ: Mapping[str, str] = os.environ) -> dict[str, str | None]:
    """Set the gauge and, when a path is off, log one line (once per process)."""
    global _announced
    if _announced is None:
        _announced = off_reasons(environ)
        metrics.FAST_PATHS.update({path: why is None for path, why in _announced.items()})
        off = [f"{path} ({why})" for path, why in _announced.items() if why is not None]
        if off:
            log.warning("fast paths off: %s", "; ".join(off))
    return _announced
