"""TLS for every Sluice server and for every hop between them, from the environment.

Three variables, the same in every process (``sluice up --tls`` sets them, the
chart mounts the files they name; see docs/security.md, "TLS"):

* ``SLUICE_TLS_CERT`` and ``SLUICE_TLS_KEY``: this server's certificate chain
  and private key (PEM files). Both or neither; with them the server speaks
  HTTPS only (a plain HTTP request to its port fails the TLS handshake and the
  connection is closed, never served), and the URLs it hands out are
  ``https://``.
* ``SLUICE_CA``: the CA bundle (PEM) this process verifies the servers it
  calls with: peer targets, the gateway's targets, transformers, the local
  controller's health probes, the SDK. Unset: the system's CAs. Certificates
  are always verified (host name included); there is no switch to skip it.

``client_context`` is the one ``ssl.SSLContext`` every client of a process
uses (httpx's ``verify=``, ``wire/clients/duplex.py``, the GetBatch share
pool); ``server_context`` is the servers' (uvicorn's ``ssl_context_factory``).

Kernel TLS: OpenSSL moves the record layer into the kernel (``SSL_OP_ENABLE_KTLS``,
``ssl.OP_ENABLE_KTLS`` on Python 3.12+) only for a connection whose socket it
drives itself. asyncio's and uvloop's TLS transports feed OpenSSL through
memory buffers (``ssl.MemoryBIO``), so kernel TLS never engages under either
loop, and ``os.sendfile``/``os.splice`` would bypass the encryption: on a TLS
server those zero-copy paths are off (``wire/http/hooks.py`` says so at start).
``server_context`` still sets the option where the runtime has it, so that a
transport that hands OpenSSL the socket picks it up.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

CERT_ENV = "SLUICE_TLS_CERT"
KEY_ENV = "SLUICE_TLS_KEY"
CA_ENV = "SLUICE_CA"
ENVS = (CERT_ENV, KEY_ENV, CA_ENV)

# OpenSSL 3's SSL_OP_ENABLE_KTLS (ssl.OP_ENABLE_KTLS from Python 3.12)
KTLS_OPTION = getattr(ssl, "OP_ENABLE_KTLS", 0)


@dataclass(frozen=True)
class ServerFiles:
    """A server's certificate chain and key (PEM paths)."""

    cert: str
    key: str


def server_files(environ: Mapping[str, str] = os.environ) -> ServerFiles | None:
    """``SLUICE_TLS_CERT``/``SLUICE_TLS_KEY``, or None (plain HTTP); ``ValueError`` names
    what is wrong (one without the other, a file that cannot be read)."""
    cert = environ.get(CERT_ENV, "").strip()
    key = environ.get(KEY_ENV, "").strip()
    if not cert and not key:
        return None
    if not cert or not key:
        have, lack = (CERT_ENV, KEY_ENV) if cert else (KEY_ENV, CERT_ENV)
        raise ValueError(f"{have} is set but {lack} is not: give both for HTTPS, or neither")
    for env, path in ((CERT_ENV, cert), (KEY_ENV, key)):
        if not os.access(path, os.R_OK):
            raise ValueError(f"{env}: cannot read {path!r}")
    return ServerFiles(cert, key)


def serving(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process's servers speak HTTPS (both files set)."""
    return bool(environ.get(CERT_ENV, "").strip() and environ.get(KEY_ENV, "").strip())


def scheme(environ: Mapping[str, str] = os.environ) -> str:
    """``https`` on a TLS server, else ``http``: the scheme of the URLs it hands out."""
    return "https" if serving(environ) else "http"


def ca_file(environ: Mapping[str, str] = os.environ) -> str | None:
    return environ.get(CA_ENV, "").strip() or None


def server_context(files: ServerFiles) -> ssl.SSLContext:
    """TLS 1.2+, HTTP/1.1 by ALPN, the certificate chain loaded; kernel TLS asked for
    where the runtime has the option (see the module's docstring)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert, files.key)
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.options |= KTLS_OPTION
    return ctx


@functools.lru_cache(maxsize=8)
def _client_context(ca: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def client_context(
    ca: str | None = None, environ: Mapping[str, str] = os.environ
) -> ssl.SSLContext:
    """The verifying context for this process's clients: ``ca`` (a PEM file), else
    ``SLUICE_CA``, else the system's CAs. One per CA file, shared (its session cache too)."""
    return _client_context(ca or ca_file(environ))


def check(environ: Mapping[str, str] = os.environ) -> None:
    """At a server's start: a bad setting is a ``ValueError`` naming it, not a traceback
    at the first request."""
    files = server_files(environ)
    ca = ca_file(environ)
    if ca is not None and not os.access(ca, os.R_OK):
        raise ValueError(f"{CA_ENV}: cannot read {ca!r}")
    try:
        if files is not None:
            server_context(files)
        if ca is not None:
            client_context(ca)
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"TLS set-up ({', '.join(ENVS)}): {e}") from None


TRANSFORMER_CERT_ENV = "SLUICE_TRANSFORMER_TLS_CERT"
TRANSFORMER_KEY_ENV = "SLUICE_TRANSFORMER_TLS_KEY"


def transformer_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What a local transformer is started with: its own certificate and key
    (``SLUICE_TRANSFORMER_TLS_CERT``/``KEY``, else this server's) and the CA."""
    cert = environ.get(TRANSFORMER_CERT_ENV) or environ.get(CERT_ENV)
    key = environ.get(TRANSFORMER_KEY_ENV) or environ.get(KEY_ENV)
    out = {CERT_ENV: cert, KEY_ENV: key, CA_ENV: environ.get(CA_ENV)}
    return {k: v for k, v in out.items() if v}
