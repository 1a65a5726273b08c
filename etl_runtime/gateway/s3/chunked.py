"""Upload bodies as S3 clients send them: aws-chunked framing and flexible checksums.

Since 2025 the AWS SDKs send an upload's checksum by default ("flexible
checksums"): in an ``x-amz-checksum-<algorithm>`` header when the body is
hashed first, or, for a streamed body, as a trailer after an aws-chunked
body (``Content-Encoding: aws-chunked``, the real length in
``x-amz-decoded-content-length``)::

    <hex size>[;chunk-signature=<sig>]\\r\\n<bytes>\\r\\n ... 0[;chunk-signature=<sig>]\\r\\n
    x-amz-checksum-crc32:<base64>\\r\\n[x-amz-trailer-signature:<sig>\\r\\n]\\r\\n

The payload hash that was signed says which form: ``STREAMING-UNSIGNED-PAYLOAD-TRAILER``
(no chunk signatures), ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD`` (each chunk
signed, chained from the request's signature) and its ``-TRAILER`` variant
(the trailer signed too). ``body`` decodes the framing while it streams,
checks every chunk signature, the decoded length, the checksum (header or
trailer; CRC32, CRC32C, CRC64NVME, SHA-1, SHA-256) and ``Content-MD5``, and
holds back the last piece until all of them match, so a body that does not
is never stored. The checksum's value is what PutObject and UploadPart
answer in ``x-amz-checksum-*``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from etl_runtime.core import auth
from etl_runtime.core.errors import InvalidRequest, S3Error

STREAMING = (
    "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
)
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
LINE_MAX = 4096  # bytes of a chunk header or trailer line
CHECKSUM_PREFIX = "x-amz-checksum-"


class _Crc:
    """A CRC with the ``hashlib`` interface: ``update`` and a big-endian ``digest``."""

    def __init__(self, fn: Callable[[bytes, int], int], size: int) -> None:
        self.fn, self.size, self.value = fn, size, 0

    def update(self, data: bytes) -> None:
        self.value = self.fn(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(self.size, "big")


def _crt(name: str) -> Callable[[bytes, int], int]:
    try:
        from awscrt import checksums
    except ImportError:  # pragma: no cover - awscrt comes with the S3 extras
        raise S3Error(
            "InvalidRequest", 400, f"the {name.upper()} checksum needs awscrt on the gateway"
        ) from None
    fn: Callable[[bytes, int], int] = getattr(checksums, name)
    return fn


ALGORITHMS: dict[str, Callable[[], Any]] = {
    "crc32": lambda: _Crc(zlib.crc32, 4),
    "crc32c": lambda: _Crc(_crt("crc32c"), 4),
    "crc64nvme": lambda: _Crc(_crt("crc64nvme"), 8),
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
}


def _bad_digest(what: str) -> S3Error:
    return S3Error("BadDigest", 400, f"the body does not match its {what}; nothing was stored")


def _incomplete(message: str) -> S3Error:
    return S3Error("IncompleteBody", 400, f"{message}; nothing was stored")


@dataclass
class Checked:
    """What a checked upload carried: its checksum (name, base64 value) once known."""

    algorithm: str | None = None
    value: str | None = None  # the header's value at once, the trailer's at the end
    trailer: bool = False
    hashes: dict[str, Any] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        if self.algorithm is None or self.value is None:
            return {}
        return {CHECKSUM_PREFIX + self.algorithm: self.value}


@dataclass(frozen=True)
class ChunkSigner:
    """The chain of chunk signatures, seeded by the request's own signature."""

    key: bytes
    amz_date: str
    scope: str
    seed: str

    def chunk(self, previous: str, sha256_hex: str) -> str:
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256-PAYLOAD", self.amz_date, self.scope, previous, EMPTY_SHA256]
            + [sha256_hex]
        )
        return hmac.new(self.key, to_sign.encode(), hashlib.sha256).hexdigest()

    def trailer(self, previous: str, text: bytes) -> str:
        digest = hashlib.sha256(text).hexdigest()
        to_sign = "\n".join(["AWS4-HMAC-SHA256-TRAILER", self.amz_date, self.scope, previous])
        to_sign += "\n" + digest
        return hmac.new(self.key, to_sign.encode(), hashlib.sha256).hexdigest()


def _algorithm_of(name: str) -> str:
    algorithm = name.lower()[len(CHECKSUM_PREFIX) :]
    if algorithm not in ALGORITHMS:
        raise S3Error("InvalidRequest", 400, f"unknown checksum {name!r}")
    return algorithm


def expect(request: Request, payload: str) -> Checked:
    """The checksum an upload promises: one ``x-amz-checksum-*`` header, or a trailer."""
    checked = Checked()
    found = [
        k for k in request.headers if k.startswith(CHECKSUM_PREFIX) and k != "x-amz-checksum-type"
    ]
    if len(found) > 1:
        raise S3Error("InvalidRequest", 400, f"more than one checksum header: {found}")
    trailer = request.headers.get("x-amz-trailer", "").strip().lower()
    if trailer:
        if not payload.endswith("-TRAILER"):
            raise S3Error(
                "InvalidRequest", 400, f"x-amz-trailer needs a trailer payload, not {payload}"
            )
        if found:
            raise S3Error("InvalidRequest", 400, "a checksum both as a header and as a trailer")
        checked.algorithm, checked.trailer = _algorithm_of(trailer), True
    elif found:
        checked.algorithm, checked.value = _algorithm_of(found[0]), request.headers[found[0]]
    if checked.algorithm is not None:
        checked.hashes[checked.algorithm] = ALGORITHMS[checked.algorithm]()
    return checked


async def _raw(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            if chunk:
                yield chunk
    except ClientDisconnect:
        raise InvalidRequest("the client went away during the upload") from None


class _Reader:
    """Lines and byte runs off the request stream."""

    def __init__(self, stream: AsyncIterator[bytes]) -> None:
        self.stream, self.buf = stream.__aiter__(), bytearray()

    async def more(self) -> bool:
        try:
            self.buf += await self.stream.__anext__()
        except StopAsyncIteration:
            return False
        return True

    async def line(self) -> bytes | None:
        while (i := self.buf.find(b"\r\n")) < 0:
            if len(self.buf) > LINE_MAX:
                raise _incomplete("an aws-chunked header line is too long")
            if not await self.more():
                if not self.buf:
                    return None
                line, self.buf = bytes(self.buf), bytearray()
                return line
        line = bytes(self.buf[:i])
        del self.buf[: i + 2]
        return line


async def _decoded(
    request: Request, checked: Checked, signer: ChunkSigner | None
) -> AsyncIterator[bytes]:
    r = _Reader(_raw(request))
    previous = signer.seed if signer else ""
    while True:
        header = await r.line()
        if header is None:
            raise _incomplete("the aws-chunked body ended before its last chunk")
        size_hex, _, ext = header.partition(b";")
        try:
            size = int(size_hex, 16)
        except ValueError:
            raise _incomplete(f"bad aws-chunked chunk size {size_hex[:32]!r}") from None
        sha = hashlib.sha256() if signer else None
        left = size
        while left:
            if not r.buf and not await r.more():
                raise _incomplete("the aws-chunked body ended inside a chunk")
            piece = bytes(r.buf[:left])
            del r.buf[: len(piece)]
            left -= len(piece)
            if sha is not None:
                sha.update(piece)
            yield piece
        if signer is not None and sha is not None:
            sent = ext.decode("latin-1").partition("chunk-signature=")[2].strip()
            expected = signer.chunk(previous, sha.hexdigest())
            if not auth.equal(expected, sent):
                raise S3Error("SignatureDoesNotMatch", 403, "a chunk's signature does not match")
            previous = expected
        if size == 0:
            break
        if await r.line() != b"":
            raise _incomplete("an aws-chunked chunk is longer than its size")
    trailers: list[bytes] = []
    while (line := await r.line()) not in (None, b""):
        assert line is not None
        trailers.append(line)
    text, signature = b"", ""
    for line in trailers:
        name, _, value = line.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip()
        if name == "x-amz-trailer-signature":
            signature = value
            continue
        text += f"{name}:{value}\n".encode("latin-1")
        if checked.trailer and name == CHECKSUM_PREFIX + (checked.algorithm or ""):
            checked.value = value
    if signer is not None and request.headers.get("x-amz-content-sha256", "").endswith("TRAILER"):
        if not auth.equal(signer.trailer(previous, text), signature):
            raise S3Error("SignatureDoesNotMatch", 403, "the trailer's signature does not match")
    if checked.trailer and checked.value is None:
        raise _incomplete(f"the trailer x-amz-checksum-{checked.algorithm} did not come")


async def body(
    request: Request,
    payload: str,
    checked: Checked,
    signer: ChunkSigner | None = None,
    sha256_hex: str | None = None,
) -> AsyncIterator[bytes]:
    """The upload's bytes, decoded and checked; the last piece held back until all match."""
    chunked = payload in STREAMING
    if chunked and payload != STREAMING[0] and signer is None:
        raise S3Error("InvalidRequest", 400, f"{payload} needs a signed request")
    md5_b64 = request.headers.get("content-md5")
    if md5_b64 is not None and not _valid_md5(md5_b64):
        raise S3Error("InvalidDigest", 400, "the Content-MD5 is not the base64 of 16 bytes")
    hashes = dict(checked.hashes)
    if sha256_hex is not None:
        hashes["x-amz-content-sha256"] = hashlib.sha256()
    if md5_b64 is not None:
        hashes["content-md5"] = hashlib.md5()
    source = _decoded(request, checked, signer) if chunked else _raw(request)
    length, held = 0, b""
    async for piece in source:
        for h in hashes.values():
            h.update(piece)
        length += len(piece)
        if held:
            yield held
        held = piece
    if chunked:
        decoded = request.headers.get("x-amz-decoded-content-length")
        if decoded is not None and decoded != str(length):
            raise _incomplete(f"x-amz-decoded-content-length is {decoded}, the body {length}")
    if sha256_hex is not None and hashes["x-amz-content-sha256"].hexdigest() != sha256_hex:
        raise S3Error(
            "XAmzContentSHA256Mismatch",
            400,
            "the body does not match its x-amz-content-sha256; nothing was stored",
        )
    if md5_b64 is not None and base64.b64encode(hashes["content-md5"].digest()).decode() != md5_b64:
        raise _bad_digest("Content-MD5")
    if checked.algorithm is not None:
        got = base64.b64encode(hashes[checked.algorithm].digest()).decode()
        if got != checked.value:
            raise _bad_digest(f"x-amz-checksum-{checked.algorithm}")
    if held:
        yield held


def _valid_md5(value: str) -> bool:
    try:
        return len(base64.b64decode(value, validate=True)) == 16
    except ValueError:
        return False


def length_of(request: Request, payload: str) -> str | None:
    """The stored object's length: the decoded length of an aws-chunked body."""
    if payload in STREAMING:
        decoded = request.headers.get("x-amz-decoded-content-length")
        if decoded is not None and not decoded.isdigit():
            raise S3Error("InvalidArgument", 400, f"bad x-amz-decoded-content-length {decoded!r}")
        return decoded
    return request.headers.get("content-length")
