"""``azure`` (alias ``az``): Azure Blob Storage containers through obstore's ``AzureStore``.

A Sluice bucket ``b`` of provider ``azure`` is the container ``b`` of a
storage account. Its props may override the targets' Azure environment (and
the gateway's, which lists the backend):

``endpoint``  the Blob service URL (else ``AZURE_STORAGE_ENDPOINT``, else
              ``https://ACCOUNT.blob.core.windows.net``); for Azurite
              ``http://127.0.0.1:10000/devstoreaccount1``
``account``   the storage account (else ``AZURE_STORAGE_ACCOUNT_NAME``): 3-24
              of a-z and 0-9
``secret``    ``anonymous`` (unsigned requests: a public container), or
              ``NAME``: a directory ``$SLUICE_SECRETS_DIR/NAME`` with the file
              ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN`` — a
              Kubernetes Secret mounted by the chart (``remote.bucketSecrets``)

Without ``secret`` the key comes from ``AZURE_STORAGE_ACCOUNT_KEY`` or
``AZURE_STORAGE_SAS_TOKEN``, else obstore finds credentials itself (a service
principal's ``AZURE_CLIENT_ID``/``AZURE_CLIENT_SECRET``/``AZURE_TENANT_ID``,
AKS workload identity's ``AZURE_FEDERATED_TOKEN_FILE``, a managed identity).
The account ``devstoreaccount1`` without a key is Azurite's well-known account
(obstore's ``use_emulator``).

Write-through PUT. A body up to ``BLOCK`` is one Put Blob; a bigger one is
staged as blocks (Put Block, up to 12 at a time, then one Put Block List that
commits them), which obstore sends and retries one by one: a block whose
connection drops or that gets a 5xx goes again alone (``RETRY_CONFIG``), and
until the list is committed no blob exists, so an upload given up leaves none
(Azure drops uncommitted blocks after a week). Azure documents a blob of at
most ``MAX_BLOCKS`` blocks of up to 4000 MiB each, so the block size grows
with the body (``block_size``): a fixed 5 MiB would refuse a body past 244 GiB
at the commit, after every byte went up.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import obstore
from obstore.store import AzureStore

from etl_runtime.core.errors import InvalidRequest
from etl_runtime.providers.backend import RemoteMeta
from etl_runtime.providers.objstore import RETRY_CONFIG, ObstoreBackend, client_options
from etl_runtime.providers.props import secret_dir

SECRET_FILES = ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN")
ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
CONTAINER = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
EMULATOR_ACCOUNT = "devstoreaccount1"
BLOCK = 5 << 20  # a bigger body is staged as blocks of at least this size
MAX_BLOCKS = 50_000  # blocks of one blob (Azure's limit; Put Block List refuses more)
MAX_BLOCK = 4000 << 20  # bytes of one block (Azure's limit, REST 2019-12-12 and later)
IN_FLIGHT = 256 << 20  # block bytes held in memory at once, at most (12 blocks of 5 MiB: 60)


def block_size(size: int) -> int:
    """The block size for a body of ``size`` bytes: 5 MiB, or the MiB multiple that keeps
    it within ``MAX_BLOCKS`` blocks."""
    mib = 1 << 20
    need = math.ceil(size / MAX_BLOCKS / mib) * mib
    return min(max(BLOCK, need), MAX_BLOCK)


def check_props(bucket: str, props: Mapping[str, Any]) -> None:
    account = props.get("account")
    if account is not None and not ACCOUNT.match(account):
        raise InvalidRequest(
            f"account {account!r} of azure bucket {bucket!r} is not a storage account name "
            "(3-24 of a-z and 0-9)",
            bucket=bucket,
        )
    _check_container(bucket)


def _check_container(bucket: str) -> None:
    if not CONTAINER.match(bucket):
        raise InvalidRequest(
            f"bucket {bucket!r} cannot be an Azure container: a container's name is 3-63 of "
            "a-z, 0-9 and '-', starting and ending with a letter or digit, no '--'",
            bucket=bucket,
        )


@dataclass(frozen=True)
class AzureSettings:
    """What an ``AzureBackend`` connects with (never logged: it holds keys)."""

    bucket: str
    endpoint: str | None
    account: str | None
    account_key: str | None = None
    sas_token: str | None = None
    anonymous: bool = False
    credentials_from: str = "environment"

    @property
    def where(self) -> str:
        if self.endpoint:
            return self.endpoint
        return f"Azure Blob ({self.account or 'no account'})"


def resolve(
    bucket: str, backend: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> AzureSettings:
    """The Azure settings of ``bucket``: its props over the environment."""
    env = os.environ if env is None else env
    _check_container(bucket)
    endpoint = backend.get("endpoint") or env.get("AZURE_STORAGE_ENDPOINT") or None
    account = backend.get("account") or env.get("AZURE_STORAGE_ACCOUNT_NAME") or None
    base: dict[str, Any] = {"bucket": bucket, "endpoint": endpoint, "account": account}
    secret = backend.get("secret")
    if secret == "anonymous":
        return AzureSettings(**base, anonymous=True, credentials_from="anonymous")
    keys: Mapping[str, str] = env
    source = "environment"
    if isinstance(secret, str):
        keys = secret_dir(env, f"azure://{bucket}", bucket, secret, SECRET_FILES)
        source = f"secret {secret!r}"
    if keys.get("AZURE_STORAGE_ACCOUNT_KEY"):
        return AzureSettings(
            **base,
            account_key=keys["AZURE_STORAGE_ACCOUNT_KEY"],
            credentials_from=f"{source} (AZURE_STORAGE_ACCOUNT_KEY)",
        )
    if keys.get("AZURE_STORAGE_SAS_TOKEN"):
        return AzureSettings(
            **base,
            sas_token=keys["AZURE_STORAGE_SAS_TOKEN"],
            credentials_from=f"{source} (AZURE_STORAGE_SAS_TOKEN)",
        )
    if isinstance(secret, str):
        raise InvalidRequest(
            f"secret {secret!r} of bucket azure://{bucket} holds neither "
            "AZURE_STORAGE_ACCOUNT_KEY nor AZURE_STORAGE_SAS_TOKEN",
            bucket=bucket,
        )
    if account == EMULATOR_ACCOUNT:
        return AzureSettings(**base, credentials_from="Azurite's well-known account key")
    return AzureSettings(**base, credentials_from="the environment (Entra ID)")


class AzureBackend(ObstoreBackend):
    provider = "azure"
    no_bucket = ("ContainerNotFound",)
    # Azure answers a wrong key 403 AuthenticationFailed; Azurite 403 AuthorizationFailure
    # "Server failed to authenticate the request"
    bad_credentials = (
        "AuthenticationFailed",
        "InvalidAuthenticationInfo",
        "NoAuthentication",
        "Server failed to authenticate",
    )
    denied = ("AuthorizationFailure", "AuthorizationPermissionMismatch", "PublicAccessNotPermitted")

    def __init__(self, settings: AzureSettings) -> None:
        self.settings = settings
        # obstore needs an account to build the store; without one every call is the
        # 401 of missing_credentials.
        config: dict[str, Any] = {"account_name": settings.account or "unset"}
        if settings.endpoint:
            config["endpoint"] = settings.endpoint
        if settings.anonymous:
            config["skip_signature"] = True
        elif settings.account_key:
            config["account_key"] = settings.account_key
        elif settings.sas_token:
            config["sas_key"] = settings.sas_token
        elif settings.account == EMULATOR_ACCOUNT:
            config["use_emulator"] = True
        store = AzureStore(
            settings.bucket,
            config=config,  # type: ignore[arg-type]
            client_options=client_options(settings.endpoint),  # type: ignore[arg-type]
            retry_config=RETRY_CONFIG,  # type: ignore[arg-type]
        )
        super().__init__(settings.bucket, settings.where, store, settings.credentials_from)

    @classmethod
    def for_bucket(
        cls, bucket: str, backend: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> AzureBackend:
        return cls(resolve(bucket, backend, env))

    async def put_file(self, name: str, path: Path) -> RemoteMeta:
        """Write-through PUT: one Put Blob, or blocks staged and committed (see above)."""
        self._check_credentials(name)
        block = block_size(path.stat().st_size)
        try:
            with open(path, "rb") as f:
                await obstore.put_async(
                    self.store,
                    name,
                    f,  # type: ignore[arg-type]
                    chunk_size=block,
                    max_concurrency=max(1, min(12, IN_FLIGHT // block)),
                )
            return RemoteMeta.of(await obstore.head_async(self.store, name))
        except Exception as e:
            raise self.error(e, name, "PUT") from None

    def missing_credentials(self) -> str | None:
        if not self.settings.account:
            return (
                "no storage account: set AZURE_STORAGE_ACCOUNT_NAME on the targets or the "
                "bucket's 'account' prop"
            )
        return None  # else obstore asks Entra ID (a managed identity at the least)


BACKEND = AzureBackend  # what etl_runtime.providers.backend.backend_class('azure') finds
