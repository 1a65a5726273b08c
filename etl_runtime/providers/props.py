"""Backend props of an ``aws`` bucket and the S3 settings they resolve to on a server.

A bucket's props may override the standard AWS environment of the targets
(and of the gateway, which lists the backend):

``endpoint``           S3 endpoint URL (else ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``,
                       else the profile's ``endpoint_url``, else AWS itself)
``region``             region (else ``AWS_REGION``/``AWS_DEFAULT_REGION``/profile, else us-east-1)
``secret``             where the keys come from: ``profile:NAME`` (an AWS profile of
                       ``~/.aws/credentials``), ``anonymous`` (unsigned requests), or
                       ``NAME``: a directory ``$SLUICE_SECRETS_DIR/NAME`` (default
                       ``/etc/sluice/secrets``) with files ``AWS_ACCESS_KEY_ID``,
                       ``AWS_SECRET_ACCESS_KEY`` [, ``AWS_SESSION_TOKEN``] — a
                       Kubernetes Secret mounted by the chart (``remote.bucketSecrets``)
``validate_warm_get``  check a cached object against the backend's ETag/Last-Modified
                       before serving it (default false, as in AIStore)
``validate_interval``  seconds a validation holds (default 0: every warm GET)

Without ``secret`` the keys come from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
[/``AWS_SESSION_TOKEN``], else from the profile ``AWS_PROFILE`` (default ``default``).
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etl_runtime.cluster.clustermap import BACKEND_KEYS
from etl_runtime.core.errors import InvalidRequest

DEFAULT_SECRETS_DIR = "/etc/sluice/secrets"
DEFAULT_REGION = "us-east-1"


def check_backend_props(bucket: str, props: Mapping[str, Any], old: Mapping[str, Any]) -> dict:
    """The backend props of a create-bck/set-bprops body, merged over ``old``; 400 if bad."""
    out = dict(old)
    for key in BACKEND_KEYS:
        if key not in props:
            continue
        value = props[key]
        if value is None:
            out.pop(key, None)
        elif key in ("endpoint", "region", "secret"):
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
        elif key == "validate_warm_get":
            if not isinstance(value, bool):
                raise InvalidRequest(
                    f"validate_warm_get of {bucket!r} must be true or false", bucket=bucket
                )
            out[key] = value
        else:  # validate_interval
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidRequest(
                    f"validate_interval of {bucket!r} must be seconds >= 0", bucket=bucket
                )
            out[key] = float(value)
    return out


@dataclass(frozen=True)
class S3Settings:
    """What an ``S3Backend`` connects with (never logged: it holds keys)."""

    bucket: str
    endpoint: str | None
    region: str
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    anonymous: bool = False
    credentials_from: str = "environment"

    @property
    def where(self) -> str:
        return self.endpoint or f"AWS S3 ({self.region})"


def _profile(env: Mapping[str, str], name: str) -> tuple[dict[str, str], dict[str, str]]:
    """(credentials, config) sections of AWS profile ``name``, empty if absent."""
    home = Path(env.get("HOME", "~")).expanduser()
    creds_file = env.get("AWS_SHARED_CREDENTIALS_FILE") or str(home / ".aws" / "credentials")
    config_file = env.get("AWS_CONFIG_FILE") or str(home / ".aws" / "config")
    creds, config = configparser.ConfigParser(), configparser.ConfigParser()
    creds.read(creds_file)
    config.read(config_file)
    section = name if name == "default" else f"profile {name}"
    return (
        dict(creds[name]) if creds.has_section(name) else {},
        dict(config[section]) if config.has_section(section) else {},
    )


def _secret_dir(env: Mapping[str, str], bucket: str, name: str) -> dict[str, str]:
    root = Path(env.get("SLUICE_SECRETS_DIR") or DEFAULT_SECRETS_DIR)
    path = root / name
    if "/" in name or name in (".", "..") or not path.is_dir():
        raise InvalidRequest(
            f"secret {name!r} of bucket aws://{bucket} is not mounted on this server "
            f"(no directory {path}); mount it or fix the bucket's 'secret' prop",
            bucket=bucket,
        )
    found = {}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        f = path / key
        if f.is_file():
            found[key] = f.read_text().strip()
    return found


def resolve(
    bucket: str, backend: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> S3Settings:
    """The S3 settings of ``bucket``: its props over the environment over the profile."""
    env = os.environ if env is None else env
    secret = backend.get("secret")
    profile_name = env.get("AWS_PROFILE") or "default"
    if isinstance(secret, str) and secret.startswith("profile:"):
        profile_name = secret[len("profile:") :]
    p_creds, p_config = _profile(env, profile_name)
    endpoint = (
        backend.get("endpoint")
        or env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL")
        or p_config.get("endpoint_url")
    )
    region = (
        backend.get("region")
        or env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
        or p_config.get("region")
        or DEFAULT_REGION
    )
    base = S3Settings(bucket=bucket, endpoint=endpoint, region=region)
    if secret == "anonymous":
        return _with(base, anonymous=True, credentials_from="anonymous")
    if isinstance(secret, str) and not secret.startswith("profile:"):
        keys = _secret_dir(env, bucket, secret)
        return _with(base, keys=keys, credentials_from=f"secret {secret!r}")
    if secret is None and env.get("AWS_ACCESS_KEY_ID"):
        return _with(base, keys=env, credentials_from="environment (AWS_ACCESS_KEY_ID)")
    keys = {
        "AWS_ACCESS_KEY_ID": p_creds.get("aws_access_key_id", ""),
        "AWS_SECRET_ACCESS_KEY": p_creds.get("aws_secret_access_key", ""),
        "AWS_SESSION_TOKEN": p_creds.get("aws_session_token", ""),
    }
    return _with(base, keys=keys, credentials_from=f"profile {profile_name!r}")


def _with(
    base: S3Settings,
    keys: Mapping[str, str] | None = None,
    anonymous: bool = False,
    credentials_from: str = "",
) -> S3Settings:
    keys = keys or {}
    return S3Settings(
        bucket=base.bucket,
        endpoint=base.endpoint,
        region=base.region,
        access_key_id=keys.get("AWS_ACCESS_KEY_ID") or None,
        secret_access_key=keys.get("AWS_SECRET_ACCESS_KEY") or None,
        session_token=keys.get("AWS_SESSION_TOKEN") or None,
        anonymous=anonymous,
        credentials_from=credentials_from,
    )
