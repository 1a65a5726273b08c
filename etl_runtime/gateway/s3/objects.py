"""The S3 object data path: the gateway streams object bytes between client and owner.

Why proxy, when the native API answers object calls with a 307 to the owner:

* botocore does not follow redirects. Its HTTP layer sends with urllib3's
  ``redirect=False``; a 3xx reaches only its ``S3RegionRedirector``, which
  re-sends to another *region's* endpoint when the answer names one, and
  otherwise hands the 3xx to the caller as an error. Measured with boto3
  1.44.8 against the native ``/v1/objects`` 307: ``get_object`` raises
  ``ClientError`` (``307``); there is nothing to follow for a ``PUT`` either.
* SigV4 signs the ``Host`` header and the path: a target could not verify the
  client's signature of a redirected call (other host, other path), so the
  gateway would have to re-sign for it anyway.

So every S3 object call is verified on the gateway and proxied to the owner
(``placement.route``, the same HRW choice as the 307) with the gateway's own
credentials (``gw.target_headers()``). Under ``sluice up`` a plain
GetObject is answered from the open file the owner hands over (``handoff.py``);
otherwise its body is spliced from the owner's socket to the client's
(``spliced.py``) where the server offers it; otherwise, and for uploads,
bodies are streamed in chunks, never buffered whole. The price of the relay
is one more loopback hop per call: ``bench/s3.py`` measures S3 GET against
native GET, and boto3 on Sluice against boto3 on MinIO (``docs/benchmarks.md``,
"S3 API").

``Content-Type`` and ``x-amz-meta-*`` of a PUT (or of CreateMultipartUpload)
are stored with the object (``storage_target/meta.py``: the native API's
``X-Sluice-Meta-*``, at most 2 KiB of user metadata as in S3) and come back
on GET and HEAD; ``binary/octet-stream`` when none was given, as S3 answers.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect

from etl_runtime.core import tls
from etl_runtime.core.access import object_url
from etl_runtime.core.errors import DuplexError, InvalidRequest, NoTargets, S3Error, SluiceError
from etl_runtime.core.names import validate_names
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.placement import route
from etl_runtime.gateway.s3 import chunked, handoff, hedge, spliced
from etl_runtime.gateway.s3.errors import from_target, from_target_parts
from etl_runtime.gateway.s3.sigv4 import UNSIGNED, Signed
from etl_runtime.getbatch.exchange import ShareBody, ShareBroken
from etl_runtime.storage.ranges import READ_CONDITIONS
from etl_runtime.wire.clients.duplex import DuplexClient
from etl_runtime.wire.http.zerocopy import FileRangeResponse, offers_zerocopy

UPLOAD_TIMEOUT = httpx.Timeout(600.0, connect=10.0)  # per read/write, not for the whole body
WHOLE_READ_MAX = 1 << 20  # answers up to this size are read whole, bigger ones streamed
READ_TIMEOUT = 600.0  # per wait for progress from the owner, not for the whole answer
ERROR_MAX = 64 << 10  # bytes of an error answer read
ANSWER_HEADERS = ("content-length", "content-range", "etag", "last-modified", "accept-ranges")
NATIVE_META, S3_META = "x-sluice-meta-", "x-amz-meta-"
DEFAULT_TYPE = "binary/octet-stream"  # S3's, for an object stored without one
SYSTEM = ("cache-control", "expires", "content-disposition", "content-encoding", "content-language")
SYSTEM_MARK = "~"  # stored metadata keys of S3's own headers start with it
PARTS = SYSTEM_MARK + "parts"  # a multipart object's part sizes (parts.py)


def mail_safe(value: str) -> str:
    """A header value with bytes past ASCII (read as latin-1) as RFC 2047 ``=?UTF-8?q?...?=``,
    as S3 stores and returns such ``x-amz-meta-*`` values (the bytes as UTF-8 where they are)."""
    raw = value.encode("latin-1")
    try:
        charset, data = "UTF-8", raw.decode("utf-8").encode("utf-8")
    except UnicodeDecodeError:
        charset, data = "ISO-8859-1", raw
    quoted = "".join(
        "_" if b == 0x20 else chr(b) if 0x21 <= b <= 0x7E and b not in b"=?_" else f"={b:02X}"
        for b in data
    )
    return f"=?{charset}?q?{quoted}?="


def meta_headers_in(headers: Any, checked: chunked.Checked | None = None) -> dict[str, str]:
    """A write's ``Content-Type``, ``x-amz-meta-*``, the headers S3 keeps (``SYSTEM``) and
    a checksum known before the body (``checked``), as the native PUT takes them.

    S3's own headers are stored as metadata keys that start with ``SYSTEM_MARK``,
    which no ``x-amz-meta-*`` key may use."""
    out: dict[str, str] = {}
    for k, v in headers.items():
        if k.startswith(S3_META):
            if k[len(S3_META) :].startswith(SYSTEM_MARK):
                raise S3Error(
                    "InvalidArgument", 400, f"{k}: metadata keys may not start with {SYSTEM_MARK!r}"
                )
            out[NATIVE_META + k[len(S3_META) :]] = v
    for name in SYSTEM:
        value = headers.get(name)
        if name == "content-encoding" and value:
            value = ",".join(e for e in value.split(",") if e.strip() != "aws-chunked").strip()
        if value:
            out[NATIVE_META + SYSTEM_MARK + name] = value
    if checked is not None and checked.value is not None:
        out.update({NATIVE_META + SYSTEM_MARK + k: v for k, v in checked.headers().items()})
    if "content-type" in headers:
        out["content-type"] = headers["content-type"]
    return {k: v if v.isascii() else mail_safe(v) for k, v in out.items()}


def _kept(headers: Mapping[str, str], checksums: bool = False) -> dict[str, str]:
    """The answer headers passed on to the S3 client, metadata renamed to ``x-amz-meta-*``;
    ``checksums``: with the stored ``x-amz-checksum-*`` (asked by ``x-amz-checksum-mode``)."""
    kept = {k: v for k, v in headers.items() if k in ANSWER_HEADERS}
    kept["content-type"] = _media(headers)  # as stored: no charset added by the Response
    for k, v in headers.items():
        if k.startswith(NATIVE_META):
            name = k[len(NATIVE_META) :]
            if not name.startswith(SYSTEM_MARK):
                kept[S3_META + name] = v
            elif name == PARTS:  # parts.py's, not a header
                continue
            elif not name.startswith(SYSTEM_MARK + chunked.CHECKSUM_PREFIX) or checksums:
                kept[name[len(SYSTEM_MARK) :]] = v
    return kept


def _not_modified(kept: dict[str, str]) -> None:
    """A 304 has no body: no length, no checksum of one (botocore would check it)."""
    for k in [k for k in kept if k == "content-length" or k.startswith(chunked.CHECKSUM_PREFIX)]:
        del kept[k]


def _checksums_asked(request: Request) -> bool:
    headers = request.headers
    return headers.get("x-amz-checksum-mode", "").upper() == "ENABLED" and "range" not in headers


def owner_url(gw: Gateway, method: str, bucket: str, key: str) -> str:
    validate_names(bucket, key)
    return object_url(route(gw, method, bucket, key).url, bucket, key)


def _unreachable(key: str, e: Exception) -> NoTargets:
    return NoTargets(
        f"the owner of {key} did not answer ({type(e).__name__}: {e}); retry", object=key
    )


def _owner_headers(gw: Gateway, request: Request) -> dict[str, str]:
    headers = {**gw.target_headers()}
    headers.update({k: v for k, v in request.headers.items() if k in READ_CONDITIONS})
    return headers


def send_early(gw: Gateway, request: Request, bucket: str, key: str) -> ShareBody | None:
    """A GetObject's request to the owner, sent before the caller checks the signature, so
    the owner reads while the gateway verifies (``early.py``; ``get(early=...)`` reads the
    answer, the caller closes it if the call is refused). Only for a cluster whose reads
    need no token: there anyone may make the owner read the object anyway. None where it
    cannot be sent at once (no idle pooled connection, a bad name): ``get`` then asks the
    usual way."""
    if gw.read_token:
        return None
    try:
        url = owner_url(gw, "GET", bucket, key)
    except SluiceError:  # the usual way says why
        return None
    return spliced.send_now(url, _owner_headers(gw, request), READ_TIMEOUT)


async def get(
    gw: Gateway,
    request: Request,
    bucket: str,
    key: str,
    head: bool = False,
    duplex: DuplexClient | None = None,
    early: ShareBody | None = None,
) -> Response:
    """GetObject / HeadObject: the owner's answer, streamed, its validators kept.

    The hop to the owner goes through ``duplex`` (``wire.duplex``, h11 framing,
    the body read straight off the socket buffer) when the app gives one:
    ``bench/s3.py`` measured it against httpx for this hop (docs/benchmarks.md,
    "S3 API"); httpx otherwise. ``early``: the GET already sent (``send_early``).
    """
    if early is None and not head and _handed(gw, request, bucket):
        handed = await _from_file(gw, bucket, key, _checksums_asked(request))
        if handed is not None:
            return handed
    if early is not None:
        try:  # raced against a copy when the owner is slow (hedge.py)
            headers = _owner_headers(gw, request)
            answer = await _hedged(gw, bucket, key, headers, _head_of(early), None)
        except (ShareBroken, OSError) as e:
            early.close()
            if early.received:
                raise _unreachable(f"{bucket}/{key}", e) from None
            # an idle connection the owner had closed: ask again on a fresh one
        else:
            if answer is not None:
                return await _relayed(answer, f"{bucket}/{key}", _checksums_asked(request))
    method = "HEAD" if head else "GET"
    sums = _checksums_asked(request)
    url = owner_url(gw, method, bucket, key)
    headers = _owner_headers(gw, request)
    if not head and spliced.offered(request):
        try:
            ask = spliced.request(url, headers, READ_TIMEOUT)
            answer = await _hedged(gw, bucket, key, headers, ask, url)
        except OSError as e:
            raise _unreachable(f"{bucket}/{key}", e) from None
        if answer is not None:
            return await _relayed(answer, f"{bucket}/{key}", sums)
    if duplex is not None:
        return await _get_duplex(duplex, method, url, headers, f"{bucket}/{key}", sums)
    try:
        r = await gw.http.send(gw.http.build_request(method, url, headers=headers), stream=True)
    except httpx.HTTPError as e:
        raise _unreachable(f"{bucket}/{key}", e) from None
    kept = _kept(r.headers, sums)
    if r.status_code >= 400 or r.status_code == 304 or head:
        body = await r.aread()
        await r.aclose()
        if r.status_code >= 400:
            raise from_target(r, body)
        if r.status_code == 304:
            _not_modified(kept)
        return Response(status_code=r.status_code, headers=kept, media_type=_media(r.headers))
    if (
        int(r.headers.get("content-length", WHOLE_READ_MAX + 1)) <= WHOLE_READ_MAX
    ):  # one read, no task
        body = await r.aread()
        await r.aclose()
        return Response(body, r.status_code, headers=kept, media_type=_media(r.headers))
    return StreamingResponse(
        r.aiter_raw(),
        r.status_code,
        headers=kept,
        media_type=_media(r.headers),
        background=BackgroundTask(r.aclose),
    )


def may_hand_off(gw: Gateway, bucket: str) -> bool:
    """Whether a plain GET may be answered from the owner's file (``handoff.py``): of a
    bucket that keeps one copy, not while the cluster rebalances (the owner would refuse:
    its GET may read from a neighbour). The caller checks that the server sends files."""
    if handoff.FILES is None:
        return False
    if gw.cmap is not None:
        cmap = gw.cmap.get()
        if cmap.rebalancing or cmap.copies(bucket) > 1:
            return False
    return True


def _handed(gw: Gateway, request: Request, bucket: str) -> bool:
    """A plain GET on a server that sends files zero-copy, or under TLS: there the
    handed file is encrypted once, by the gateway (``FileRangeResponse`` reads it),
    where the relay costs the owner's encryption and the gateway's decryption too."""
    headers = request.headers
    if any(h in headers for h in READ_CONDITIONS):
        return False
    if not (offers_zerocopy(request.scope) or tls.serving()):
        return False
    return may_hand_off(gw, bucket)


async def _from_file(gw: Gateway, bucket: str, key: str, sums: bool) -> Response | None:
    """GetObject from the owner's open file where it hands one (``handoff.py``), else None."""
    assert handoff.FILES is not None
    validate_names(bucket, key)
    owner = route(gw, "GET", bucket, key).id
    props = gw.cmap.get().buckets.get(bucket) if gw.cmap is not None else None
    opened = await handoff.FILES.open(owner, bucket, key, props.created if props else None)
    if opened is None:
        return None
    fd, headers = opened
    f = os.fdopen(fd, "rb")
    try:
        size = int(headers["content-length"])
        kept, media = _kept(headers, sums), _media(headers)
        if size > spliced.SPLICE_MIN:
            return FileRangeResponse(f, 0, size, 200, headers=kept, media_type=media)
        body = os.pread(fd, size, 0)
    except BaseException:
        f.close()
        raise
    f.close()
    if len(body) != size:  # cut under us: the route reads it again
        return None
    return spliced.WholeResponse(body, 200, headers=kept, media_type=media)


async def _head_of(answer: ShareBody) -> ShareBody:
    """The early GET's answer once its head is in (closed if that fails or is cancelled)."""
    try:
        await answer.read_head()
    except BaseException:
        answer.close()
        raise
    return answer


def _hedged(
    gw: Gateway,
    bucket: str,
    key: str,
    headers: dict[str, str],
    first: Awaitable[ShareBody | None],
    asked: str | None,
) -> Awaitable[ShareBody | None]:
    """``first`` (the owner's answer, from ``asked``; None: where ``send_early`` sent it)
    raced against a copy's once it is ``SLUICE_HEDGE_AFTER`` late (``hedge.py``); the
    loser is closed. A bucket of one copy, or hedging off: ``first`` alone, no task."""
    after = hedge.hedge_after()
    if after is None or not hedge.has_copies(gw, bucket):
        return first
    try:  # now: by the time the hedge starts, the map may route to the copy already
        sent_to = owner_url(gw, "GET", bucket, key) if asked is None else asked
    except SluiceError:
        sent_to = ""

    def second() -> Awaitable[ShareBody | None] | None:
        url = hedge.copy_url(gw, bucket, key, sent_to)
        return None if url is None else spliced.request(url, headers, READ_TIMEOUT)

    return hedge.first_head(first, second, _close, after)


def _close(answer: ShareBody | None) -> None:
    if answer is not None:
        answer.close()


async def _relayed(answer: ShareBody, what: str, sums: bool = False) -> Response:
    """A GET's answer from the owner on a raw pooled connection (``spliced.request``)."""
    status, kept = answer.status, _kept(answer.headers, sums)
    if status >= 400:
        body = await answer.read_all(ERROR_MAX)
        raise from_target_parts(status, answer.headers, body)
    media = _media(answer.headers)
    if status == 304 or answer.left <= spliced.SPLICE_MIN:
        try:
            body = await answer.exactly(answer.left)
            await answer.end()
        except ShareBroken as e:
            answer.close()
            raise _unreachable(what, e) from None
        if status == 304:
            _not_modified(kept)
        return spliced.WholeResponse(body, status, headers=kept, media_type=media)
    return spliced.SplicedResponse(answer, status, kept, media, what, READ_TIMEOUT)


async def _get_duplex(
    duplex: DuplexClient,
    method: str,
    url: str,
    headers: dict[str, str],
    what: str,
    sums: bool = False,
) -> Response:
    try:
        r = await duplex.request(method, url, headers=headers, timeout=READ_TIMEOUT)
    except (DuplexError, OSError) as e:
        raise _unreachable(what, e) from None
    kept = _kept(r.headers, sums)
    length = r.headers.get("content-length", "")
    if r.status_code >= 400 or r.status_code == 304 or method == "HEAD":
        body = await r.read(ERROR_MAX)  # HEAD and 304: empty, read to keep the connection
        if r.status_code >= 400:
            raise from_target_parts(r.status_code, r.headers, bytes(body))
        if r.status_code == 304:
            _not_modified(kept)
        return Response(status_code=r.status_code, headers=kept, media_type=_media(r.headers))
    if length.isdigit() and int(length) <= WHOLE_READ_MAX:  # one read, no task
        body = await r.read(WHOLE_READ_MAX)
        return Response(bytes(body), r.status_code, headers=kept, media_type=_media(r.headers))
    return StreamingResponse(
        _as_bytes(r.aiter_bytes()),
        r.status_code,
        headers=kept,
        media_type=_media(r.headers),
        background=BackgroundTask(r.aclose),
    )


async def _as_bytes(chunks: AsyncIterator[bytes | bytearray]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield bytes(chunk) if isinstance(chunk, bytearray) else chunk


def _media(headers: Mapping[str, str]) -> str:
    ctype = headers.get("content-type", "")
    return DEFAULT_TYPE if ctype in ("", "application/octet-stream") else ctype


async def checked_body(
    request: Request, sha256_hex: str | None, md5_b64: str | None = None
) -> AsyncIterator[bytes]:
    """The request body, chunk by chunk, checked against its signed hash and ``Content-MD5``.

    With either to check, the last chunk is held back until both match:
    the owner has not received the whole body when one is found wrong, so
    the upload is cut short and nothing is stored.
    """
    sha = hashlib.sha256() if sha256_hex else None
    md5 = hashlib.md5() if md5_b64 else None
    held = b""
    try:
        async for chunk in request.stream():
            if not chunk:
                continue
            if sha is not None:
                sha.update(chunk)
            if md5 is not None:
                md5.update(chunk)
            if held:
                yield held
            held = chunk
    except ClientDisconnect:
        raise InvalidRequest("the client went away during the upload") from None
    if sha is not None and sha.hexdigest() != sha256_hex:
        raise S3Error(
            "XAmzContentSHA256Mismatch",
            400,
            "the body does not match its x-amz-content-sha256; nothing was stored",
        )
    if md5 is not None and base64.b64encode(md5.digest()).decode() != md5_b64:
        raise S3Error("BadDigest", 400, "the body does not match its Content-MD5; not stored")
    if held:
        yield held


async def put_stream(
    gw: Gateway,
    bucket: str,
    key: str,
    body: AsyncIterator[bytes],
    length: str | None,
    meta: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Stream ``body`` into the object's owner as a normal PUT; the owner's JSON answer.

    ``meta``: native metadata headers (``meta_headers_in``) stored with it.
    """
    url = owner_url(gw, "PUT", bucket, key)
    headers = {**gw.target_headers(), **(meta or {})}
    if length is not None:
        headers["content-length"] = length
    upload = gw.http.build_request(
        "PUT", url, content=body, headers=headers, timeout=UPLOAD_TIMEOUT
    )
    try:
        r = await gw.http.send(upload)
    except S3Error:
        raise
    except httpx.HTTPError as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, S3Error | InvalidRequest):  # raised by our body, inside httpx
            raise cause from None
        raise _unreachable(f"{bucket}/{key}", e) from None
    if r.status_code >= 400:
        raise from_target(r, r.content)
    answer: dict[str, Any] = r.json()
    return answer


def upload_body(
    request: Request, signed: Signed | None
) -> tuple[AsyncIterator[bytes], chunked.Checked, str | None]:
    """An upload's body as stored (aws-chunked decoded), checked as it streams
    (``chunked.body``); the checksum it carried; the stored length."""
    payload = signed.payload_hash if signed is not None else UNSIGNED
    checked = chunked.expect(request, payload)
    signer = signed.signer if signed is not None else None
    sha = signed.body_sha256 if signed is not None else None
    body = chunked.body(request, payload, checked, signer, sha)
    return body, checked, chunked.length_of(request, payload)


async def check_write(gw: Gateway, request: Request, bucket: str, key: str) -> None:
    """S3's conditional writes: ``If-None-Match: *`` (412 if the key exists) or ``ETAG``
    (412 if it is that version) and ``If-Match: ETAG`` (412 if it is another version,
    404 if there is none), checked against the owner just before the write."""
    if_match, if_none = request.headers.get("if-match"), request.headers.get("if-none-match")
    if if_match is None and if_none is None:
        return
    url = owner_url(gw, "HEAD", bucket, key)
    try:
        r = await gw.http.head(url, headers=gw.target_headers())
    except httpx.HTTPError as e:
        raise _unreachable(f"{bucket}/{key}", e) from None
    if r.status_code >= 400 and r.status_code != 404:
        raise from_target(r, b"")
    exists, etag = r.status_code < 400, r.headers.get("etag", "").strip('"')
    if if_none is not None and exists and _matches(if_none, etag):
        raise S3Error("PreconditionFailed", 412, f"If-None-Match: {bucket}/{key} exists as {etag}")
    if if_match is not None:
        if not exists:
            raise S3Error("NoSuchKey", 404, f"If-Match: {bucket}/{key} does not exist")
        if not _matches(if_match, etag):
            raise S3Error("PreconditionFailed", 412, f"If-Match: {bucket}/{key} is another version")


def _matches(header: str, etag: str) -> bool:
    """Whether an ``If-Match`` / ``If-None-Match`` list (or ``*``) names ``etag``."""
    tags = [t.strip().removeprefix("W/").strip('"') for t in header.split(",")]
    return "*" in tags or etag in tags


async def put(
    gw: Gateway, request: Request, bucket: str, key: str, signed: Signed | None
) -> Response:
    """PutObject: the body streamed to the owner; ``ETag`` is the MD5 of the bytes stored."""
    await check_write(gw, request, bucket, key)
    body, checked, length = upload_body(request, signed)
    if checked.trailer and length is not None and length.isdigit():
        if int(length) <= WHOLE_READ_MAX:  # read first: the trailer's checksum is stored
            data = b"".join([chunk async for chunk in body])
            body = _whole(data)
    meta = meta_headers_in(request.headers, checked)
    stored = await put_stream(gw, bucket, key, body, length, meta)
    return Response(headers={"ETag": f'"{stored["etag"]}"', **checked.headers()})


async def _whole(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def delete(gw: Gateway, bucket: str, key: str) -> None:
    """DeleteObject: S3 answers 204 whether or not the key existed; so do we."""
    url = owner_url(gw, "DELETE", bucket, key)
    try:
        r = await gw.http.delete(url, headers=gw.target_headers())
    except httpx.HTTPError as e:
        raise _unreachable(f"{bucket}/{key}", e) from None
    if r.status_code >= 400:
        err = from_target(r, r.content)
        if err.code != "NoSuchKey":
            raise err


async def read_parts(gw: Gateway, parts: list[tuple[str, str]]) -> AsyncIterator[bytes]:
    """The bytes of several objects ``(bucket, key)``, one after the other, streamed."""
    for bucket, key in parts:
        url = owner_url(gw, "GET", bucket, key)
        try:
            async with gw.http.stream("GET", url, headers=gw.target_headers()) as r:
                if r.status_code != 200:
                    raise from_target(r, await r.aread())
                async for chunk in r.aiter_raw():
                    yield chunk
        except httpx.HTTPError as e:
            raise _unreachable(f"{bucket}/{key}", e) from None
