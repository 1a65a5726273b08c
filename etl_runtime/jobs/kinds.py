"""The registry of job kinds: what a target runs for a job, and how the gateway checks it.

A kind is registered once, at import, by the module that implements it::

    register_kind("etl-bck", run=run_transform, validate=check_transform)

``load_kinds()`` imports every module that registers a kind; the gateway and
the targets call it at start, so both know the same kinds.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from etl_runtime.core.errors import InvalidRequest

if TYPE_CHECKING:
    from etl_runtime.jobs.context import JobContext

# Modules that register kinds (one line per kind module).
KIND_MODULES: list[str] = [
    "etl_runtime.jobs.transform",
    "etl_runtime.dsort.job",
    "etl_runtime.jobs.prefetch",  # prefetch, evict (remote buckets)
    "etl_runtime.jobs.listrange",  # delete-listrange
    "etl_runtime.jobs.archive",  # archive: a list of objects into one tar/tgz/zip
    "etl_runtime.jobs.move",  # move-bck: a bucket renamed
    "etl_runtime.jobs.scrub",  # scrub: check every object's bytes, repair from copies
]

Run = Callable[["JobContext"], Awaitable[None]]
# validate(gateway, spec) -> the normalized spec; raise a SluiceError (400/404) to refuse.
Validate = Callable[[Any, dict[str, Any]], Awaitable[dict[str, Any]]]
# receive(ctx, sender_target, meta, body) -> a JSON-able answer for the sender.
Receive = Callable[["JobContext", str, dict[str, Any], AsyncIterator[bytes]], Awaitable[Any]]


@dataclass(frozen=True)
class Kind:
    name: str
    run: Run
    validate: Validate | None = None
    receive: Receive | None = None
    resumable: bool = True  # False: a target restart fails the job (with the reason)


_KINDS: dict[str, Kind] = {}


def register_kind(
    name: str,
    run: Run,
    *,
    validate: Validate | None = None,
    receive: Receive | None = None,
    resumable: bool = True,
) -> Kind:
    kind = Kind(name, run, validate, receive, resumable)
    _KINDS[name] = kind
    return kind


def load_kinds() -> dict[str, Kind]:
    for module in KIND_MODULES:
        importlib.import_module(module)
    return dict(_KINDS)


def get_kind(name: str) -> Kind:
    load_kinds()
    kind = _KINDS.get(name)
    if kind is None:
        raise InvalidRequest(
            f"unknown job kind {name!r}; known: {', '.join(sorted(_KINDS)) or 'none'}"
        )
    return kind
