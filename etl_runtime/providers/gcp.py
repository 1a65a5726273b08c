"""``gcp`` (alias ``gs``): Google Cloud Storage buckets through obstore's ``GCSStore``.

A bucket's props may override the targets' Google environment (and the
gateway's, which lists the backend):

``endpoint``  GCS endpoint URL (else ``STORAGE_EMULATOR_HOST``, the variable
              Google's own clients read for an emulator, else
              ``https://storage.googleapis.com``)
``project``   the project (else ``GOOGLE_CLOUD_PROJECT``); named in messages,
              checked as a project id (6-30 of a-z, 0-9, '-', starting with a letter)
``secret``    ``anonymous`` (unsigned requests: a public bucket, or an emulator), or
              ``NAME``: a directory ``$SLUICE_SECRETS_DIR/NAME`` with the file
              ``GOOGLE_SERVICE_ACCOUNT_KEY`` (a service account's JSON key) — a
              Kubernetes Secret mounted by the chart (``remote.bucketSecrets``)

Without ``secret`` the key comes from ``GOOGLE_SERVICE_ACCOUNT_KEY`` (the JSON)
or ``GOOGLE_APPLICATION_CREDENTIALS`` (its path), else from the metadata
server (GKE workload identity, a GCE service account); with an emulator
endpoint and none of these, no credentials are sent.

Tokens. One token source feeds obstore (``credential_provider``) and the
write-through PUT: a service account key signs its own JWTs (no token
exchange), the metadata server hands out the VM's. The PUT goes by the JSON
API, which GCS and fake-gcs-server both take (fake-gcs-server 1.56 refuses
obstore's XML-API PUT): up to ``RESUMABLE_ABOVE`` one media upload
(``/upload/storage/v1/b/B/o?uploadType=media``), a bigger body a resumable
upload (``uploadType=resumable``: a session, then ``RESUMABLE_CHUNK`` bytes a
request, each ``Content-Range: bytes A-B/SIZE``, from the offset the backend's
``308`` says it kept), so no single request carries a whole big shard; an
interrupted chunk resumes from the byte GCS says it lacks
(``providers/gcp_upload.py``). GET, HEAD, LIST and DELETE are obstore's.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import obstore
from obstore.store import GCSStore

from etl_runtime.core.errors import InvalidRequest, SluiceError
from etl_runtime.providers.backend import RemoteMeta
from etl_runtime.providers.gcp_upload import (  # noqa: F401  (RESUMABLE_*: also named here)
    RESUMABLE_ABOVE,
    RESUMABLE_CHUNK,
    StatusError,
    Upload,
)
from etl_runtime.providers.objstore import (
    CONNECT_TIMEOUT,
    RETRY_CONFIG,
    ObstoreBackend,
    client_options,
)
from etl_runtime.providers.props import secret_dir

GCS = "https://storage.googleapis.com"
METADATA = (
    "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
)
SECRET_FILES = ("GOOGLE_SERVICE_ACCOUNT_KEY",)
PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
ANONYMOUS_TOKEN = "anonymous"  # sent where no credentials are: an emulator checks none
# A stalled backend fails a chunk after this long without a byte moving (then it resumes).
UPLOAD_TIMEOUT = httpx.Timeout(60, connect=float(CONNECT_TIMEOUT.rstrip("s")))


def check_props(bucket: str, props: Mapping[str, Any]) -> None:
    project = props.get("project")
    if project is not None and not PROJECT.match(project):
        raise InvalidRequest(
            f"project {project!r} of gcp bucket {bucket!r} is not a GCP project id "
            "(6-30 of a-z, 0-9 and '-', starting with a letter)",
            bucket=bucket,
        )


@dataclass(frozen=True)
class GcsSettings:
    """What a ``GcsBackend`` connects with (never logged: it holds the key)."""

    bucket: str
    endpoint: str
    project: str | None
    key: dict[str, Any] | None = None  # a service account's JSON key
    anonymous: bool = False
    credentials_from: str = "environment"

    @property
    def where(self) -> str:
        if self.endpoint != GCS:
            return self.endpoint
        return f"GCS ({self.project or 'default project'})"


def resolve(
    bucket: str, backend: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> GcsSettings:
    """The GCS settings of ``bucket``: its props over the environment."""
    env = os.environ if env is None else env
    emulator = env.get("STORAGE_EMULATOR_HOST")
    if emulator and "://" not in emulator:
        emulator = f"http://{emulator}"
    endpoint = str(backend.get("endpoint") or emulator or GCS).rstrip("/")
    project = backend.get("project") or env.get("GOOGLE_CLOUD_PROJECT") or None
    base: dict[str, Any] = {"bucket": bucket, "endpoint": endpoint, "project": project}
    secret = backend.get("secret")
    if secret == "anonymous":
        return GcsSettings(**base, anonymous=True, credentials_from="anonymous")
    if isinstance(secret, str):
        found = secret_dir(env, f"gcp://{bucket}", bucket, secret, SECRET_FILES)
        key = _key(bucket, found.get("GOOGLE_SERVICE_ACCOUNT_KEY"), f"secret {secret!r}")
        return GcsSettings(**base, key=key, credentials_from=f"secret {secret!r}")
    if env.get("GOOGLE_SERVICE_ACCOUNT_KEY"):
        key = _key(bucket, env["GOOGLE_SERVICE_ACCOUNT_KEY"], "GOOGLE_SERVICE_ACCOUNT_KEY")
        return GcsSettings(
            **base, key=key, credentials_from="environment (GOOGLE_SERVICE_ACCOUNT_KEY)"
        )
    path = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if path:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise InvalidRequest(
                f"GOOGLE_APPLICATION_CREDENTIALS of this server names no readable file "
                f"({e.strerror}) for gcp://{bucket}",
                bucket=bucket,
            ) from None
        key = _key(bucket, text, "GOOGLE_APPLICATION_CREDENTIALS")
        return GcsSettings(
            **base, key=key, credentials_from="environment (GOOGLE_APPLICATION_CREDENTIALS)"
        )
    if endpoint != GCS:  # an emulator, or a gateway that takes no Google credentials
        return GcsSettings(**base, anonymous=True, credentials_from=f"none (endpoint {endpoint})")
    return GcsSettings(**base, credentials_from="the metadata server")


def _key(bucket: str, text: str | None, where: str) -> dict[str, Any]:
    try:
        key = json.loads(text or "")
        if not isinstance(key, dict) or not key.get("private_key") or not key.get("client_email"):
            raise ValueError
    except ValueError:
        raise InvalidRequest(
            f"{where} holds no service account key (JSON with client_email and private_key) "
            f"for gcp://{bucket}",
            bucket=bucket,
        ) from None
    return key


class Tokens:
    """Bearer tokens for GCS: self-signed JWTs of a key, the metadata server's, or none."""

    def __init__(self, settings: GcsSettings) -> None:
        self.settings = settings
        self._token: tuple[str, float] | None = None
        self._signer: Any = None
        if settings.key is not None:
            from cryptography.hazmat.primitives import serialization

            self._signer = serialization.load_pem_private_key(
                settings.key["private_key"].encode(), password=None
            )

    async def __call__(self) -> dict[str, Any]:
        """obstore's ``credential_provider``: ``{"token", "expires_at"}``."""
        import datetime as dt

        token, expires = await self.token()
        at = dt.datetime.fromtimestamp(expires, dt.UTC) if expires else None
        return {"token": token, "expires_at": at}

    async def token(self) -> tuple[str, float]:
        if self.settings.anonymous:
            return ANONYMOUS_TOKEN, 0.0
        now = time.time()
        if self._token is not None and self._token[1] - 300 > now:
            return self._token
        if self._signer is not None:
            self._token = (self._jwt(now), now + 3600)
        else:
            async with httpx.AsyncClient(timeout=5) as c:
                r = await c.get(METADATA, headers={"Metadata-Flavor": "Google"})
                r.raise_for_status()
                body = r.json()
            self._token = (str(body["access_token"]), now + float(body.get("expires_in", 300)))
        return self._token

    def _jwt(self, now: float) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        key = self.settings.key or {}
        header = {"alg": "RS256", "typ": "JWT", "kid": key.get("private_key_id", "")}
        email = key["client_email"]
        claims = {
            "iss": email,
            "sub": email,
            "aud": "https://storage.googleapis.com/",
            "iat": int(now),
            "exp": int(now) + 3600,
        }
        signing = f"{_b64(header)}.{_b64(claims)}".encode()
        signature = self._signer.sign(signing, padding.PKCS1v15(), hashes.SHA256())
        return signing.decode() + "." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()


def _b64(obj: Any) -> str:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class GcsBackend(ObstoreBackend):
    provider = "gcp"
    # fake-gcs-server answers a missing bucket's XML listing 500 "no bucket named B"
    no_bucket = ("The specified bucket does not exist", "NoSuchBucket", "no bucket named")
    bad_credentials = ("Invalid Credentials", "invalid_grant", "Error performing token request")
    denied = ("AccessDenied", "does not have storage.objects", "Forbidden")

    def __init__(self, settings: GcsSettings) -> None:
        self.settings = settings
        self.tokens = Tokens(settings)
        signed = self._store(credential_provider=self.tokens)
        # Anonymous: reads go unsigned (a public bucket refuses a token it cannot
        # check); obstore signs a DELETE whatever, so that one keeps the token source.
        store = self._store(skip_signature=True) if settings.anonymous else signed
        self._signed = signed
        super().__init__(settings.bucket, settings.where, store, settings.credentials_from)
        self._http: httpx.AsyncClient | None = None

    def _store(self, skip_signature: bool = False, credential_provider: Any = None) -> Any:
        config: dict[str, Any] = {"base_url": self.settings.endpoint}
        auth: dict[str, Any] = {}
        if skip_signature:
            config["skip_signature"] = True
        else:
            auth["credential_provider"] = credential_provider
        return GCSStore(
            self.settings.bucket,
            config=config,  # type: ignore[arg-type]
            client_options=client_options(self.settings.endpoint),  # type: ignore[arg-type]
            retry_config=RETRY_CONFIG,  # type: ignore[arg-type]
            **auth,
        )

    @classmethod
    def for_bucket(
        cls, bucket: str, backend: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> GcsBackend:
        return cls(resolve(bucket, backend, env))

    async def delete(self, name: str) -> None:
        self._check_credentials(name)
        try:
            await obstore.delete_async(self._signed, name)
        except Exception as e:
            raise self.error(e, name, "DELETE") from None

    async def put_file(self, name: str, path: Path) -> RemoteMeta:
        """Write-through PUT: the JSON API's media upload (a big body: a resumable
        upload that resumes an interrupted chunk; providers/gcp_upload.py), then the
        object's meta."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=UPLOAD_TIMEOUT)
        try:
            token, _ = await self.tokens.token()
            auth = {"Authorization": f"Bearer {token}"} if not self.settings.anonymous else {}
            r = await Upload(
                http=self._http,
                url=f"{self.settings.endpoint}/upload/storage/v1/b/{self.bucket}/o",
                auth=auth,
                name=name,
                path=path,
                size=path.stat().st_size,
                uri=self.uri(name),
                where=self.where,
                bucket=self.bucket,
            ).run()
        except SluiceError:
            raise
        except Exception as e:
            raise self.error(e, name, "PUT") from None
        if r.status_code >= 300:
            raise self.error(StatusError(r), name, "PUT")
        meta = await self.head(name)
        if meta is None:
            raise self.error(FileNotFoundError(f"{name} gone after its upload"), name, "PUT")
        return meta


BACKEND = GcsBackend  # what etl_runtime.providers.backend.backend_class('gcp') finds
