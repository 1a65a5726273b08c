"""The one list of bucket providers: their names, AIStore's aliases, and the module of each.

A bucket is ``ais`` (stored by Sluice) or remote: a cache in front of a bucket
of the same name in another object store. Each remote provider is one module
of ``etl_runtime.providers`` (its client, its props and their checks, its
errors mapped to Sluice's), named here and imported by name on first use
(``etl_runtime.providers.backend.backend_class``). Adding a provider is that
module plus one ``Provider`` line below.

The list lives in ``core`` because everything that reads a provider's name
needs it, the SDK and ``core.params`` included, and they may import only core;
nothing outside ``etl_runtime.providers`` spells a provider's name but this
module.
"""

from __future__ import annotations

from dataclasses import dataclass

AIS = "ais"  # a bucket stored by Sluice itself


@dataclass(frozen=True)
class Provider:
    name: str  # AIStore's name: ?provider=NAME, BucketProps.provider, NAME://bucket
    aliases: tuple[str, ...]  # other spellings AIStore accepts (s3://, gs://, az://)
    module: str  # the module whose BACKEND implements it
    title: str  # what it is, for messages
    props: tuple[str, ...]  # the backend props its buckets take (besides the cache's)


# Props every remote bucket takes: how its cache checks a cold and a warm object.
CACHE_PROPS = ("validate_cold_get", "validate_warm_get", "validate_interval")

PROVIDERS: tuple[Provider, ...] = (
    Provider(
        "aws", ("s3",), "etl_runtime.providers.aws", "an S3-compatible backend",
        ("endpoint", "region", "secret"),
    ),
    Provider(
        "gcp", ("gs",), "etl_runtime.providers.gcp", "Google Cloud Storage",
        ("endpoint", "project", "secret"),
    ),
    Provider(
        "azure", ("az",), "etl_runtime.providers.azure", "Azure Blob Storage",
        ("endpoint", "account", "secret"),
    ),
)  # fmt: skip

_BY_SPELLING = {s: p for p in PROVIDERS for s in (p.name, *p.aliases)}

# Every backend prop any provider takes (the cluster map keeps them per bucket).
BACKEND_KEYS: tuple[str, ...] = tuple(
    dict.fromkeys(k for p in PROVIDERS for k in (*p.props, *CACHE_PROPS))
)


def find(spelling: str) -> Provider | None:
    """The remote provider spelled ``spelling`` (its name or an alias), or None."""
    return _BY_SPELLING.get(spelling)


def canonical(spelling: str | None) -> str | None:
    """``gs`` -> ``gcp``, ``s3`` -> ``aws``, ``ais``/``""``/None -> ``ais``; unknown -> None."""
    if not spelling or spelling == AIS:
        return AIS
    p = _BY_SPELLING.get(spelling)
    return p.name if p is not None else None


def is_remote(spelling: str | None) -> bool:
    """Whether ``spelling`` names a remote provider (``aws``, ``gs``, ...)."""
    return bool(spelling) and spelling in _BY_SPELLING


def names() -> tuple[str, ...]:
    """The remote providers' names, in the list's order."""
    return tuple(p.name for p in PROVIDERS)


def spellings() -> tuple[str, ...]:
    """Every accepted value of ``?provider=``: ``ais``, the names, their aliases."""
    return (AIS, *_BY_SPELLING)


def described() -> str:
    """``'ais' (stored by Sluice), 'aws' (an S3-compatible backend), ...`` for messages."""
    return ", ".join(
        [f"{AIS!r} (stored by Sluice)", *(f"{p.name!r} ({p.title})" for p in PROVIDERS)]
    )


def split_uri(ref: str) -> tuple[str, str]:
    """``gs://b/o`` -> (``gcp``, ``b/o``); ``ais://b`` and a bare ``b`` -> (``ais``, ``b``)."""
    scheme, sep, rest = ref.partition("://")
    if not sep:
        return AIS, ref
    provider = canonical(scheme)
    if provider is None:
        return AIS, ref  # not a provider's scheme: a Sluice bucket's name
    return provider, rest
