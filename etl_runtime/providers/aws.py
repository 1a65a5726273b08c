"""``aws``: S3-compatible buckets (AWS S3, MinIO, Ceph...) through obstore's ``S3Store``.

A bucket's props may override the standard AWS environment of the targets
(and of the gateway, which lists the backend):

``endpoint``  S3 endpoint URL (else ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``,
              else the profile's ``endpoint_url``, else AWS itself)
``region``    region (else ``AWS_REGION``/``AWS_DEFAULT_REGION``/profile, else us-east-1)
``secret``    where the keys come from: ``profile:NAME`` (an AWS profile of
              ``~/.aws/credentials``), ``anonymous`` (unsigned requests), or
              ``NAME``: a directory ``$SLUICE_SECRETS_DIR/NAME`` (default
              ``/etc/sluice/secrets``) with files ``AWS_ACCESS_KEY_ID``,
              ``AWS_SECRET_ACCESS_KEY`` [, ``AWS_SESSION_TOKEN``] — a
              Kubernetes Secret mounted by the chart (``remote.bucketSecrets``)

Without ``secret`` the keys come from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
[/``AWS_SESSION_TOKEN``], else from the profile ``AWS_PROFILE`` (default ``default``).
The calls and the error mapping are ``etl_runtime.providers.objstore``'s; S3's
words for a missing bucket and bad keys are below.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obstore.store import S3Store

from etl_runtime.providers.objstore import RETRY_CONFIG, ObstoreBackend, client_options
from etl_runtime.providers.props import secret_dir

DEFAULT_REGION = "us-east-1"
SECRET_FILES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


class S3Backend(ObstoreBackend):
    provider = "aws"
    no_bucket = ("NoSuchBucket",)
    bad_credentials = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken")
    denied = ("AccessDenied",)

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        config: dict[str, Any] = {"region": settings.region}
        if settings.endpoint:
            config["endpoint"] = settings.endpoint
        if settings.anonymous:
            config["skip_signature"] = True
        elif settings.access_key_id and settings.secret_access_key:
            config["access_key_id"] = settings.access_key_id
            config["secret_access_key"] = settings.secret_access_key
            if settings.session_token:
                config["session_token"] = settings.session_token
        self._has_credentials = bool(
            settings.anonymous or "access_key_id" in config or _ambient_credentials()
        )
        store = S3Store(
            settings.bucket,
            config=config,  # type: ignore[arg-type]
            client_options=client_options(settings.endpoint),  # type: ignore[arg-type]
            retry_config=RETRY_CONFIG,  # type: ignore[arg-type]
        )
        super().__init__(settings.bucket, settings.where, store, settings.credentials_from)

    @classmethod
    def for_bucket(
        cls, bucket: str, backend: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> S3Backend:
        return cls(resolve(bucket, backend, env))

    def missing_credentials(self) -> str | None:
        if self._has_credentials:
            return None
        return (
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) on the targets, or "
            "the bucket's 'secret' prop"
        )


def _ambient_credentials() -> bool:
    """Credentials obstore finds itself (web identity on EKS, container credentials)."""
    return any(
        os.environ.get(k)
        for k in (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        )
    )


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
    return secret_dir(env, f"aws://{bucket}", bucket, name, SECRET_FILES)


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


BACKEND = S3Backend  # what etl_runtime.providers.backend.backend_class('aws') finds
