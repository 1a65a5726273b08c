"""``Client``: one connection pool to a Sluice gateway, and the entry point of the SDK.

``Client`` knows how to talk HTTP to the cluster (auth header, timeouts, error
mapping, following the gateway's 307 to the owning target); ``Bucket``,
``Object`` and ``Etl`` are thin handles that build requests and parse answers.

Object calls follow redirects by hand instead of letting httpx do it: httpx
drops ``Authorization`` when a redirect changes port, and cannot re-send a
streamed file body. We send the first request to the gateway without a body,
then send the real request to the target named in ``Location`` with the same
headers.

Every call is retried on 503/429 and connection failures (``retry.py``); an
object call starts again at the gateway, which may by then redirect elsewhere,
except a read whose redirected hop failed to connect or was reset before its
answer (the transformer a target sent it to just died): that one goes back to
the target that redirected it, which then answers 503 + ``Retry-After`` or
sends it to the transformer's replacement.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from etl_runtime.core import tls
from etl_runtime.sdk import errors, hedge
from etl_runtime.sdk.errors import SluiceError
from etl_runtime.sdk.retry import RETRY_STATUSES, RETRY_TRANSPORT_ERRORS, Attempts, RetryPolicy

if TYPE_CHECKING:
    from etl_runtime.sdk.batch import BatchItem
    from etl_runtime.sdk.bucket import Bucket
    from etl_runtime.sdk.etl import Etl, EtlSummary
    from etl_runtime.sdk.job import Job

DEFAULT_ENDPOINT = "http://127.0.0.1:8080"
REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
# A redirect's body read to its end before it is closed, up to this: an unread
# streamed answer closes its connection (httpcore cannot reuse it), and over TLS a
# new connection per object is a handshake per object.
REDIRECT_BODY_MAX = 64 << 10


def release_redirect(response: httpx.Response) -> None:
    """Close a redirect's answer so that its connection goes back to the pool."""
    try:
        length = int(response.headers.get("content-length", "-1"))
        if 0 <= length <= REDIRECT_BODY_MAX:
            response.read()
    except (ValueError, httpx.HTTPError):
        pass  # then it is closed, as before
    response.close()


HEDGED = ("GET", "HEAD")  # reads the gateway redirected: hedged (sdk/hedge.py)


@functools.lru_cache(maxsize=4)
def _default_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return httpx.create_ssl_context()  # httpx's verify=True (certifi, or SSL_CERT_FILE/DIR)


def default_context() -> ssl.SSLContext:
    """httpx's default verifying context, made once per process (and per
    ``SSL_CERT_FILE``/``SSL_CERT_DIR``): loading the CA bundle costs about 0.2 s of
    CPU, which every ``Client`` of a DataLoader worker would otherwise pay again."""
    return _default_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


EtlArgs = str | Mapping[str, Any] | None
EtlName = str | Sequence[str] | None  # a list: a pipeline, applied in order


def encode_etl_args(etl_args: EtlArgs) -> str | None:
    """``etl_args`` as sent on the wire: strings as-is, mappings as compact JSON."""
    if etl_args is None:
        return None
    if isinstance(etl_args, str):
        return etl_args
    return json.dumps(dict(etl_args), separators=(",", ":"))


def etl_params(etl_name: EtlName, etl_args: EtlArgs) -> dict[str, str]:
    params: dict[str, str] = {}
    if isinstance(etl_name, str):
        etl_name = [etl_name] if etl_name else []
    if etl_name:  # ["a", "b", "c"]: etl_name=a&etl_pipeline=b,c (AIStore's shape)
        params["etl_name"] = etl_name[0]
        if len(etl_name) > 1:
            params["etl_pipeline"] = ",".join(etl_name[1:])
    args = encode_etl_args(etl_args)
    if args is not None:
        params["etl_args"] = args
    return params


def quote_path(name: str) -> str:
    """Percent-encode a bucket/object name for a URL path, keeping ``/`` separators.

    ``.`` and ``..`` segments are encoded too: URL libraries would otherwise
    resolve them on the client side and silently address another object, while
    the server rejects them with a clear 400.
    """
    parts = []
    for seg in name.split("/"):
        if seg in (".", ".."):
            parts.append(seg.replace(".", "%2E"))
        else:
            parts.append(urllib.parse.quote(seg, safe=""))
    return "/".join(parts)


class Client:
    """A connection to a Sluice cluster.

    ``endpoint`` defaults to ``$SLUICE_ENDPOINT`` (else ``http://127.0.0.1:8080``),
    ``token`` to ``$SLUICE_TOKEN``. ``timeout`` (seconds) bounds connecting and
    each read, not a whole transfer. ``retries`` is how many more times a call
    answered 503/429, or whose connection failed, is tried (0: never), waiting
    ``Retry-After`` or an exponential back-off; a ``RetryPolicy`` sets the
    back-off too. ``ca`` is the CA file (PEM) an ``https://`` cluster's
    certificates are verified with (default ``$SLUICE_CA``, else the system's
    CAs; ``sluice up --tls`` prints its own). Use it as a context manager, or ``close()``.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int | RetryPolicy = 5,
        ca: str | os.PathLike[str] | None = None,
    ) -> None:
        endpoint = endpoint or os.environ.get("SLUICE_ENDPOINT") or DEFAULT_ENDPOINT
        if "://" not in endpoint:
            endpoint = f"http://{endpoint}"
        self.endpoint = endpoint.rstrip("/")
        self.token = token if token is not None else (os.environ.get("SLUICE_TOKEN") or None)
        self.timeout = timeout
        self.retry = retries if isinstance(retries, RetryPolicy) else RetryPolicy(retries)
        headers = {"User-Agent": "sluice-sdk"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self.ca = os.fspath(ca) if ca is not None else tls.ca_file()
        verify = tls.client_context(self.ca) if self.ca else default_context()
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout), verify=verify)
        # A read the gateway redirected, not answered within this many seconds, is asked
        # again at the gateway (sdk/hedge.py; $SLUICE_HEDGE_AFTER, default 1; None: off).
        self.hedge_after = hedge.hedge_after_from_env()

    # -- handles ---------------------------------------------------------------

    def bucket(self, name: str, provider: str = "ais") -> Bucket:
        """``provider="aws"``/``"gcp"``/``"azure"`` (or ``s3``/``gs``/``az``): a remote
        bucket cached by Sluice (``RemoteBucket``)."""
        from etl_runtime.core import providers
        from etl_runtime.sdk.bucket import Bucket

        if providers.is_remote(provider):
            from etl_runtime.sdk.remote import RemoteBucket

            return RemoteBucket(self, name, provider)
        if provider != providers.AIS:
            raise ValueError(f"provider {provider!r} is not supported: {providers.described()}")
        return Bucket(self, name)

    def etl(self, name: str) -> Etl:
        from etl_runtime.sdk.etl import Etl

        return Etl(self, name)

    def job(self, job_id: str) -> Job:
        """A handle on a job (``etl_runtime.sdk.job``)."""
        from etl_runtime.sdk.job import Job

        return Job(self, job_id)

    def jobs(self, kind: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        """Every job (newest first), as ``GET /v1/jobs`` aggregates them."""
        from etl_runtime.sdk.job import list_jobs

        return list_jobs(self, kind, state)

    def dsort(self, spec: Mapping[str, Any]) -> Job:
        """Start a dSort (shuffle / reshard) job from AIStore's spec (docs/dsort.md)."""
        from etl_runtime.sdk.job import Job

        return Job(self, str(self.request_json("POST", "/v1/dsort", json_body=dict(spec))["id"]))

    def get_batch(
        self,
        items: Iterable[tuple[str, str]],
        *,
        etl_name: EtlName = None,
        etl_args: EtlArgs = None,
        missing_ok: bool = False,
    ) -> Iterator[BatchItem]:
        """Many ``(bucket, object)`` in one request (GetBatch), in order: ``sdk/batch.py``."""
        from etl_runtime.sdk.batch import get_batch

        return get_batch(self, items, etl_name=etl_name, etl_args=etl_args, missing_ok=missing_ok)

    def list_buckets(self) -> list[str]:
        return list(self.request_json("GET", "/v1/buckets")["buckets"])

    def list_etls(self) -> list[EtlSummary]:
        from etl_runtime.sdk.etl import EtlSummary

        data = self.request_json("GET", "/v1/etl")
        return [EtlSummary.from_dict(d) for d in data.get("etls", [])]

    def health(self) -> dict[str, Any]:
        return self.request_json("GET", "/v1/health")

    def cluster(self) -> dict[str, Any]:
        """The cluster map and targets: members, away, buckets, rebalance progress.

        ``{"version", "members", "away", "buckets", "rebalance": {"id", "state",
        ...}, "targets": [{"id","url","node","alive","member","rebalance"}]}``
        (docs/placement.md).
        """
        return self.request_json("GET", "/v1/cluster")

    # -- plumbing shared by the handles -----------------------------------------

    def url(self, path: str, params: Mapping[str, str] | None = None) -> str:
        url = f"{self.endpoint}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, quote_via=urllib.parse.quote)
        return url

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        context: Mapping[str, str | None] | None = None,
    ) -> httpx.Response:
        """A non-object API call to the gateway; raises the typed error on 4xx/5xx."""
        what = f"{method} {path} on {self.endpoint}"
        attempts = Attempts(self.retry, what)
        while True:
            try:
                response = self._http.request(
                    method, self.endpoint + path, params=params, json=json_body
                )
            except httpx.TransportError as exc:
                error: SluiceError = errors.from_transport(exc, what)
                if isinstance(exc, RETRY_TRANSPORT_ERRORS) and attempts.again(error):
                    continue
                raise attempts.exhausted(error) from exc
            if response.status_code < 400:
                return response
            error = errors.from_response(response, **dict(context or {}))
            retry_after = response.headers.get("retry-after")
            if response.status_code in RETRY_STATUSES and attempts.again(error, retry_after):
                continue
            raise attempts.exhausted(error)

    def request_json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        data = self.request(method, path, **kwargs).json()
        return data if isinstance(data, dict) else {"value": data}

    @contextlib.contextmanager
    def object_request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        context: Mapping[str, str | None] | None = None,
    ) -> Iterator[httpx.Response]:
        """An object call, redirects followed by hand; yields the open (streamed) response.

        ``content`` (bytes, or a callable returning a fresh iterable/file for each
        attempt) is only sent once we know the final URL, with ``headers``. A
        503/429 or a failed connection starts the call again at the gateway,
        unless ``content`` is a one-shot iterator that already began to go out.
        """
        ctx = dict(context or {})
        what = f"{method} {ctx.get('bucket')}/{ctx.get('object')}"
        body = _Body(content)
        attempts = Attempts(self.retry, what)
        resume: str | None = None
        while True:
            tried: list[str | None] = []
            try:
                response = self._follow_redirects(
                    method, path, params, body, headers, what, resume, tried
                )
            except httpx.TransportError as exc:
                error: SluiceError = errors.from_transport(exc, what)
                retry = isinstance(exc, RETRY_TRANSPORT_ERRORS) and body.resendable
                # A hop a redirect led to failed before its answer (a transformer
                # that just died, an owner going away): try again at the URL that
                # sent us there, which knows by then (503 + Retry-After, or a live
                # address). That URL failing too starts again at the gateway.
                resume = tried[-2] if body.empty and len(tried) > 1 else None  # None: gateway
                if retry and attempts.again(error):
                    continue
                raise attempts.exhausted(error) from exc
            resume = None
            if response.status_code < 400:
                break
            try:
                response.read()
            except httpx.TransportError:
                pass
            finally:
                response.close()
            error = errors.from_response(response, **ctx)
            retry = response.status_code in RETRY_STATUSES and body.resendable
            if retry and attempts.again(error, response.headers.get("retry-after")):
                continue
            raise attempts.exhausted(error)
        try:
            yield response
        finally:
            response.close()

    def _follow_redirects(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: _Body,
        headers: Mapping[str, str] | None,
        what: str,
        resume: str | None = None,
        tried: list[str | None] | None = None,
    ) -> httpx.Response:
        """One try of an object call: gateway, then ``Location`` hops; the last answer.

        ``resume``: a URL a redirect gave earlier (a bodyless call only), tried
        instead of the gateway. ``tried`` gets every URL tried, in order (None: the gateway).
        """
        tried = [] if tried is None else tried

        def send(url: str, params: Mapping[str, str] | None, content: Any) -> httpx.Response:
            # Headers go with the real call: a GET's every hop, a body's hop (not its probe).
            extra = headers if content != b"" else None
            request = self._http.build_request(
                method, url, params=params, content=content, headers=extra
            )
            if _signed_elsewhere(request.url, self.endpoint):
                # A hop the gateway or a target signed needs no token, and one may be a
                # transformer, where ETL code runs: it must never see the caller's token.
                request.headers.pop("authorization", None)
            return self._http.send(request, stream=True)

        url, query = (self.endpoint + path, params) if resume is None else (resume, None)
        # First hop: no body (the gateway only redirects); later hops carry it.
        tried.append(resume)
        response = send(url, query, None if body.empty else b"")
        if not body.empty and response.status_code < 300:
            # The endpoint is a target, not a gateway: the probe was the real call.
            response.close()
            response = send(url, params, body.fresh())
        hops = 0
        while response.status_code in REDIRECTS and "location" in response.headers:
            hops += 1
            release_redirect(response)
            if hops > MAX_REDIRECTS:
                raise SluiceError(f"{what}: more than {MAX_REDIRECTS} redirects")
            # The Location carries the whole query (and a signature); don't re-add params.
            url = str(response.url.join(response.headers["location"]))
            tried.append(url)
            if hops == 1 and resume is None and body.empty and method in HEDGED:
                response = self._hedged(send, url, path, params)
                continue
            response = send(url, None, None if body.empty else body.fresh())
        return response

    def _hedged(
        self,
        send: Callable[[str, Mapping[str, str] | None, Any], httpx.Response],
        url: str,
        path: str,
        params: Mapping[str, str] | None,
    ) -> httpx.Response:
        """The hop the gateway redirected a read to, hedged (``sdk/hedge.py``): not
        answered within ``hedge_after`` seconds, the gateway is asked again, and a
        different target it names is asked too; the first answer wins."""
        if not self.hedge_after:
            return send(url, None, None)

        after, first = self.hedge_after, urllib.parse.urlsplit(url).netloc

        def elsewhere() -> httpx.Response | None:
            for _ in range(hedge.ASKS):  # the gateway may not suspect the target yet
                again = send(self.endpoint + path, params, None)
                again.close()
                if again.status_code not in REDIRECTS or "location" not in again.headers:
                    return None
                other = str(again.url.join(again.headers["location"]))
                if urllib.parse.urlsplit(other).netloc != first:
                    return send(other, None, None)
                time.sleep(after)  # the same target: ask again a little later
            return None

        return hedge.first_answer(lambda: send(url, None, None), elsewhere, after)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.endpoint!r})"


def _signed_elsewhere(url: httpx.URL, endpoint: str) -> bool:
    """``url`` is not the gateway's and carries a redirect's signature (``core/auth.py``)."""
    return "sluice_sig" in url.params and url.copy_with(path="/", query=None) != httpx.URL(
        endpoint
    ).copy_with(path="/", query=None)


class _Body:
    """A request body that knows whether it can be sent again.

    Bytes and callables (which return a fresh iterable or file each time) can;
    a bare iterator can only until its first byte went out.
    """

    def __init__(self, content: Any) -> None:
        self.content = content
        self.empty = content is None
        self.started = False
        self.replayable = (
            self.empty
            or callable(content)
            or isinstance(content, bytes | bytearray | memoryview | str)
        )

    @property
    def resendable(self) -> bool:
        return self.replayable or not self.started

    def fresh(self) -> Any:
        self.started = True
        return self.content() if callable(self.content) else self.content
