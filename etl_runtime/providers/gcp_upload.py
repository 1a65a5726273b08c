"""The JSON API upload of a ``gcp`` write-through PUT, and how it survives an interrupted chunk.

Called by ``GcsBackend.put_file`` (providers/gcp.py), which maps what this
raises to the Sluice error of ``ObstoreBackend.error``. Up to
``RESUMABLE_ABOVE`` a body is one media upload; a bigger one is a resumable
upload as GCS documents it (cloud.google.com/storage/docs/performing-resumable-uploads):

- ``POST ...?uploadType=resumable`` opens a session (its ``Location``), then
  ``RESUMABLE_CHUNK`` bytes per ``PUT`` with ``Content-Range: bytes A-B/SIZE``;
  each ``308`` says what GCS kept (``Range: bytes=0-N``, none: nothing) and the
  next request starts at ``N+1``.
- A chunk that fails on the way (a reset connection, a timeout, 408, 429 or a
  5xx) may have been kept in part, so after a backoff the session is asked
  where it stands (``PUT`` with ``Content-Range: bytes */SIZE``, no body): a
  ``308`` names the next byte, a ``200``/``201`` says it is complete. Only the
  bytes GCS lacks go again. ``ATTEMPTS`` failures in a row without a byte of
  progress give the upload up (503, the session cancelled).
- A session that is gone (``404``/``410``) restarts once with a new session.
- Any other 4xx is the request's fault and fails at once.
- A session finished short of the body's size is torn: GCS never does that,
  fake-gcs-server does (it finishes a session on a status query, whatever it
  holds), so it counts as a gone session, and a torn object the upload leaves
  behind when it gives up is deleted (only that generation).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from etl_runtime.core.errors import BackendError, BackendUnavailable

RESUMABLE_ABOVE = 8 << 20  # a bigger write-through body goes up as a resumable upload
RESUMABLE_CHUNK = 8 << 20  # bytes per request of it (GCS: a multiple of 256 KiB)
STALLS = 3  # 308s in a row to a chunk that keep no new byte before the upload is given up
ATTEMPTS = 5  # failed requests in a row, without progress, before the upload is given up
BACKOFF = 0.25  # seconds before the first retry, doubled each time up to BACKOFF_MAX
BACKOFF_MAX = 4.0
TRANSIENT = frozenset({408, 429, 500, 502, 503, 504})  # GCS: retry these
GONE = frozenset({404, 410})  # the session expired or was lost


class StatusError(Exception):
    """A JSON API answer that was not a success, worded as obstore words them."""

    def __init__(self, r: httpx.Response) -> None:
        self.status = r.status_code
        super().__init__(f"Server returned non-2xx status code: {r.status_code}: {r.text[:300]}")


class _SessionGone(Exception):
    """The session cannot go on (404/410, or finished torn): a new one may."""


@dataclass
class Upload:
    """One object's upload: where it goes, with what, from which file."""

    http: httpx.AsyncClient
    url: str  # .../upload/storage/v1/b/BUCKET/o
    auth: dict[str, str]
    name: str
    path: Path
    size: int
    uri: str  # gcp://bucket/object, for messages
    where: str  # the backend, for messages
    bucket: str

    async def run(self) -> httpx.Response:
        """The upload's last answer (a success, or a refusal to map); raises when given up."""
        if self.size <= RESUMABLE_ABOVE:
            return await self.http.post(
                self.url,
                params={"uploadType": "media", "name": self.name},
                headers={**self.auth, "Content-Length": str(self.size)},
                content=read(self.path, 0, self.size),
            )
        torn: list[int] = []  # generations of torn objects this upload made
        answer: httpx.Response | None = None
        try:
            answer = await self._sessions(torn)
            return answer
        finally:
            if torn and (answer is None or answer.status_code >= 300):
                await self._drop_torn(torn)

    async def _sessions(self, torn: list[int]) -> httpx.Response:
        """A session and its chunks; a second session if the first is gone."""
        for last in (False, True):
            start = await self._retrying(
                lambda: self.http.post(
                    self.url,
                    params={"uploadType": "resumable", "name": self.name},
                    headers={
                        **self.auth,
                        "X-Upload-Content-Length": str(self.size),
                        "Content-Length": "0",
                    },
                ),
                "the start of",
            )
            session = start.headers.get("location")
            if start.status_code >= 300 or not session:
                return start if start.status_code >= 300 else _no_session(start)
            try:
                return await self._chunks(session, torn)
            except _SessionGone as gone:
                if last:
                    raise self._refused(f"{gone} again, on a new session") from None
        raise AssertionError("unreachable: the second session returns or raises")

    async def _chunks(self, session: str, torn: list[int]) -> httpx.Response:
        offset, stalls, failures = 0, 0, 0
        query = False  # ask where the session stands before sending more
        while True:
            try:
                if query:
                    r = await self.http.put(
                        session,
                        headers={
                            **self.auth,
                            "Content-Length": "0",
                            "Content-Range": f"bytes */{self.size}",
                        },
                    )
                else:
                    n = min(RESUMABLE_CHUNK, self.size - offset)
                    r = await self.http.put(
                        session,
                        headers={
                            **self.auth,
                            "Content-Length": str(n),
                            "Content-Range": f"bytes {offset}-{offset + n - 1}/{self.size}",
                        },
                        content=read(self.path, offset, n),
                    )
            except httpx.TransportError as e:  # reset, timed out, cut: kept in part, maybe
                why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            else:
                if r.status_code in (200, 201):
                    self._check_whole(r, torn)
                    return r
                if r.status_code == 308:
                    got = kept(r)
                    if got > offset:
                        failures = 0
                    if not query:
                        stalls = stalls + 1 if got <= offset else 0
                    if stalls >= STALLS or got >= self.size:
                        raise self._refused(
                            f"the backend kept {got} of {self.size} bytes and asks for more"
                        )
                    offset, query = got, False
                    continue
                if r.status_code in GONE:
                    raise _SessionGone(f"the upload session is gone ({r.status_code})")
                if r.status_code not in TRANSIENT:
                    await self._cancel(session)
                    return r  # the request's fault: mapped by the caller, never retried
                why = f"{r.status_code} {r.text[:200]}".strip()
            failures += 1
            if failures >= ATTEMPTS:
                await self._cancel(session)
                raise BackendUnavailable(
                    f"backend {self.where} failed the resumable upload of {self.uri} "
                    f"{failures} times in a row at byte {offset} of {self.size} ({why}); "
                    "nothing was stored, retry in a few seconds",
                    bucket=self.bucket,
                    object=self.name,
                    backend=self.where,
                )
            await asyncio.sleep(min(BACKOFF * 2 ** (failures - 1), BACKOFF_MAX))
            query = True

    async def _retrying(self, send: Any, what: str) -> httpx.Response:
        """``send()``'s answer, retried with backoff while it fails transiently."""
        for failure in range(1, ATTEMPTS + 1):
            try:
                r: httpx.Response = await send()
                if r.status_code not in TRANSIENT:
                    return r
                why = f"{r.status_code}"
            except httpx.TransportError as e:
                why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if failure < ATTEMPTS:
                await asyncio.sleep(min(BACKOFF * 2 ** (failure - 1), BACKOFF_MAX))
        raise BackendUnavailable(
            f"backend {self.where} failed {what} the resumable upload of {self.uri} "
            f"{ATTEMPTS} times ({why}); nothing was stored, retry in a few seconds",
            bucket=self.bucket,
            object=self.name,
            backend=self.where,
        )

    def _check_whole(self, r: httpx.Response, torn: list[int]) -> None:
        """A finished session's object must hold the whole body (fake-gcs may finish short)."""
        try:
            body = r.json()
            size, generation = int(body["size"]), body.get("generation")
        except (ValueError, TypeError, KeyError):
            return  # no object resource to check
        if size != self.size:
            if generation is not None:
                torn.append(int(generation))
            raise _SessionGone(f"the session finished with {size} of {self.size} bytes")

    def _refused(self, why: str) -> BackendError:
        return BackendError(
            f"backend {self.where} refused the resumable upload of {self.uri}: {why}; "
            "nothing was stored",
            bucket=self.bucket,
            object=self.name,
            backend=self.where,
        )

    async def _cancel(self, session: str) -> None:
        """Cancel the session (GCS answers 499), so none of its bytes become an object."""
        with contextlib.suppress(httpx.HTTPError):
            await self.http.delete(session, headers=self.auth, timeout=5)

    async def _drop_torn(self, torn: list[int]) -> None:
        """Delete the torn objects a failed upload left (exactly their generations)."""
        base = self.url.replace("/upload/storage/v1/", "/storage/v1/", 1)
        for generation in torn:
            with contextlib.suppress(httpx.HTTPError):
                await self.http.delete(
                    f"{base}/{_quote(self.name)}",
                    params={"ifGenerationMatch": str(generation)},
                    headers=self.auth,
                    timeout=5,
                )


def kept(r: httpx.Response) -> int:
    """The next byte a ``308`` asks for: ``Range: bytes=0-N`` is N+1, none is 0."""
    held = r.headers.get("range", "")
    return int(held.rsplit("-", 1)[1]) + 1 if "-" in held else 0


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


def _no_session(r: httpx.Response) -> httpx.Response:
    """A session start answered without its ``Location``: worded as a refusal."""
    return httpx.Response(502, text=f"no Location in the answer ({r.status_code}) to the start")


async def read(path: Path, offset: int, n: int) -> AsyncIterator[bytes]:
    """``n`` bytes of ``path`` from ``offset``, a MiB at a time."""
    import anyio

    async with await anyio.open_file(path, "rb") as f:
        await f.seek(offset)
        while n > 0 and (chunk := await f.read(min(n, 1 << 20))):
            n -= len(chunk)
            yield chunk
