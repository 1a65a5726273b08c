"""Backend props of remote buckets: the checks every provider shares, and mounted secrets.

The props a bucket may carry are its provider's (``etl_runtime.core.providers``:
``aws`` takes endpoint/region/secret, ``gcp`` endpoint/project/secret,
``azure`` endpoint/account/secret) plus the cache's, which every remote bucket
takes:

``validate_cold_get``  check a fill's bytes against the backend's MD5 (an ETag that is
                       one) before its last byte is served or it is cached (default
                       false, as in AIStore; ``providers/cache.py``, "Cold GET")
``validate_warm_get``  check a cached object against the backend's ETag/Last-Modified
                       before serving it (default false, as in AIStore)
``validate_interval``  seconds a validation holds (default 0: every warm GET)

``secret`` is where the credentials come from: ``anonymous`` (unsigned
requests), or ``NAME``, a directory ``$SLUICE_SECRETS_DIR/NAME`` (default
``/etc/sluice/secrets``) — a Kubernetes Secret mounted by the chart
(``remote.bucketSecrets``) — holding the provider's files; ``aws`` also takes
``profile:NAME``. Without ``secret`` each provider reads its standard
environment. A provider module may check its props further with
``check_props(bucket, props)``; each module's docstring says what its props mean.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from etl_runtime.core import providers as registry
from etl_runtime.core.errors import InvalidRequest

DEFAULT_SECRETS_DIR = "/etc/sluice/secrets"
STRING_PROPS = ("endpoint", "region", "secret", "project", "account")


def check_backend_props(
    bucket: str, props: Mapping[str, Any], old: Mapping[str, Any], provider: str = "aws"
) -> dict:
    """The backend props of a create-bck/set-bprops body, merged over ``old``; 400 if bad."""
    found = registry.find(provider)
    if found is None:
        raise InvalidRequest(
            f"provider {provider!r} of bucket {bucket!r} is not supported: {registry.described()}",
            bucket=bucket,
        )
    allowed = (*found.props, *registry.CACHE_PROPS)
    foreign = sorted(k for k in props if k in registry.BACKEND_KEYS and k not in allowed)
    if foreign:
        raise InvalidRequest(
            f"bucket props {foreign} are not props of {found.name} buckets; {bucket!r} "
            f"takes {', '.join(allowed)}",
            bucket=bucket,
        )
    out = dict(old)
    for key in allowed:
        if key not in props:
            continue
        value = props[key]
        if value is None:
            out.pop(key, None)
        elif key in STRING_PROPS:
            if not isinstance(value, str) or not value.strip():
                raise InvalidRequest(
                    f"bucket prop {key!r} of {bucket!r} must be a non-empty string", bucket=bucket
                )
            if key == "endpoint" and not value.startswith(("http://", "https://")):
                raise InvalidRequest(
                    f"endpoint of bucket {bucket!r} must be an http(s):// URL, got {value!r}",
                    bucket=bucket,
                )
            out[key] = value.strip()
        elif key in ("validate_cold_get", "validate_warm_get"):
            if not isinstance(value, bool):
                raise InvalidRequest(f"{key} of {bucket!r} must be true or false", bucket=bucket)
            out[key] = value
        else:  # validate_interval
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidRequest(
                    f"validate_interval of {bucket!r} must be seconds >= 0", bucket=bucket
                )
            out[key] = float(value)
    check = getattr(importlib.import_module(found.module), "check_props", None)
    if check is not None:
        check(bucket, out)
    return out


def secret_dir(
    env: Mapping[str, str], uri: str, bucket: str, name: str, files: tuple[str, ...]
) -> dict[str, str]:
    """The ``files`` present in the mounted secret ``name`` of bucket ``uri``; 400 if absent."""
    root = Path(env.get("SLUICE_SECRETS_DIR") or DEFAULT_SECRETS_DIR)
    path = root / name
    if "/" in name or name in (".", "..") or not path.is_dir():
        raise InvalidRequest(
            f"secret {name!r} of bucket {uri} is not mounted on this server "
            f"(no directory {path}); mount it or fix the bucket's 'secret' prop",
            bucket=bucket,
        )
    found = {}
    for key in files:
        f = path / key
        if f.is_file():
            found[key] = f.read_text().strip()
    return found
