"""``etl_fqn``: which files a transformer may open by path.

For ``argType: fqn`` the target sends the path of the object's file instead
of its bytes. Anyone holding the transformer's token could send any path, so
the transformer opens only files whose resolved real path (symlinks and
``..`` followed) lies under one of its data roots: the target's data
directory, given by whoever starts the transformer in ``SLUICE_DATA_ROOTS``
(``os.pathsep``-separated). Everything else is a 400 before any file is
opened, and so is every ``etl_fqn`` when no root was given.

Under ``sluice up`` as root the ETL's uid cannot open a target's objects by
path at all; the transformer is told of its target's file broker instead
(``$SLUICE_FD_BROKER``, ``etl/grants.py``) and ``FqnAccess`` asks it for each
file with the grant the target sent beside ``etl_fqn`` (``etl_grant``). The
code downstream (worker processes, inline threads, an AIStore class that
wants a path) gets ``/proc/<pid>/fd/N`` for it, which opens the handed file;
the descriptors are closed once the request's answer is done
(``Releasing``). A file the broker refuses is a 403 ``FileRefused`` naming
the object; a broker that cannot be asked, a 503.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from etl_runtime.core.errors import BadRequest, FileRefused, NotReady, SluiceError
from etl_runtime.etl import grants

log = logging.getLogger("sluice.transformer")

DATA_ROOTS_ENV = "SLUICE_DATA_ROOTS"


def data_roots(value: str | None = None) -> tuple[str, ...]:
    """The real paths of the roots in ``value`` (default: ``$SLUICE_DATA_ROOTS``)."""
    raw = os.environ.get(DATA_ROOTS_ENV, "") if value is None else value
    return tuple(os.path.realpath(p) for p in raw.split(os.pathsep) if os.path.isabs(p))


def confine(fqn: str, roots: tuple[str, ...], dirs: dict[str, str] | None = None) -> str:
    """The real path of ``fqn`` if it lies under one of ``roots``; else ``BadRequest``.

    ``dirs``: the real paths of directories already resolved (one batch's: its
    files share a few directories, and ``realpath`` costs a ``lstat`` per
    component); a file that is not a symlink itself is then one ``lstat``."""
    if "\x00" in fqn or not os.path.isabs(fqn):
        raise BadRequest(f"etl_fqn must be an absolute path, got {fqn!r:.200}")
    if not roots:
        raise BadRequest(
            f"etl_fqn refused: this transformer has no data root ({DATA_ROOTS_ENV} is not set)"
        )
    head, tail = os.path.split(fqn)
    if dirs is not None and tail not in ("", ".", "..") and not os.path.islink(fqn):
        if head not in dirs:
            dirs[head] = os.path.realpath(head)
        real = os.path.join(dirs[head], tail)
    else:
        real = os.path.realpath(fqn)
    if not any(real == root or real.startswith(_dir(root)) for root in roots):
        log.warning("etl_fqn %r refused: outside the data roots %s", fqn[:300], roots)
        raise BadRequest("etl_fqn refused: the path lies outside the target's data directory")
    return real


def _dir(root: str) -> str:
    """``root`` with one trailing ``/``: a real path under it starts with this. (Both are
    real paths, so normalized: the test ``os.path.commonpath`` made, without its cost,
    which was 5% of a transformer's CPU per item of a batch.)"""
    return root if root.endswith("/") else root + "/"


class FqnAccess:
    """How this transformer opens ``etl_fqn`` files: confined by path (``roots``), or
    handed by its target's broker (``broker``; module docstring)."""

    def __init__(self, roots: tuple[str, ...], broker: grants.BrokerClient | None) -> None:
        self.roots = roots
        self.broker = broker

    @classmethod
    def from_env(cls, roots: tuple[str, ...] | None = None) -> FqnAccess:
        return cls(data_roots() if roots is None else roots, grants.BrokerClient.from_env())

    async def one(self, obj: str, fqn: str, grant: str | None, held: list[int]) -> str:
        """The path the code opens ``obj``'s file by; ``held`` gets its descriptor."""
        if self.broker is None:
            return confine(fqn, self.roots)  # under the target's data dir, or 400 unopened
        path = (await self.many([(obj, fqn, grant)], held))[0]
        if isinstance(path, SluiceError):
            raise path
        return path

    async def many(
        self, items: Sequence[tuple[str, str, str | None]], held: list[int]
    ) -> list[str | SluiceError]:
        """Each ``(object, etl_fqn, grant)``'s path, or why it is refused."""
        if self.broker is None:
            dirs: dict[str, str] = {}
            out: list[str | SluiceError] = []
            for _, fqn, _ in items:
                try:
                    out.append(confine(fqn, self.roots, dirs))
                except SluiceError as e:
                    out.append(e)
            return out
        if "\x00" in "".join(fqn for _, fqn, _ in items):
            raise BadRequest("etl_fqn must be a path, not one with a NUL byte")
        try:
            answers = await self.broker.open([(fqn, grant) for _, fqn, grant in items])
        except OSError as e:
            log.warning("file broker %s: %r", self.broker.path, e)
            raise NotReady(
                "this transformer cannot ask its target for the objects' files "
                f"({type(e).__name__}); retry shortly"
            ) from None
        paths: list[str | SluiceError] = []
        for (obj, _, _), answer in zip(items, answers, strict=True):
            if isinstance(answer, int):
                held.append(answer)
                paths.append(grants.fd_path(answer))
            else:
                why = f"the target refused the file of object {obj!r}: {answer}"
                paths.append(FileRefused(why))
        return paths


class Releasing(Response):
    """``inner`` as it is, and the descriptors ``fds`` closed once it was sent (or broke)."""

    def __init__(self, inner: Response, fds: list[int]) -> None:  # no super(): it forwards
        self.inner, self.fds = inner, fds
        self.status_code, self.raw_headers = inner.status_code, inner.raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            grants.close_all(self.fds)
            self.fds.clear()


def released(response: Response, fds: list[int]) -> Response:
    return Releasing(response, fds) if fds else response
