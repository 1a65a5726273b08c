"""Real GCS and Azure Blob emulators on loopback, for tests/providers and bench/remote.py.

``FakeGcs`` runs fake-gcs-server (built by scripts/fake-gcs.sh into
~/.cache/sluice/bin) and ``Azurite`` runs Azurite's blob service (installed by
scripts/azurite.sh into ~/.cache/sluice/tools/azurite). Where the tool is not
there yet, ``start()`` runs its script first (cached by version, like
scripts/minio.sh), so a test never skips for a missing emulator.

Both are seeded and inspected with the provider's official client
(google-cloud-storage, azure-storage-blob), which the targets never use.
Each has the same small interface: ``env()`` (what the cluster's servers
get), ``create_bucket``, ``put``, ``read``, ``names``, ``delete``,
``stop``/``start`` (same port and data).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, in Microsoft's documentation).
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def cache_dir() -> Path:
    return Path(os.environ.get("SLUICE_CACHE") or Path.home() / ".cache" / "sluice")


def ensure_tool(path: Path, script: str) -> Path:
    """``path``, installing it with ``scripts/<script>`` first if it is not there."""
    if not path.exists():
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / script)], capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(
                f"scripts/{script} did not install {path} (exit {done.returncode}): "
                f"{(done.stdout + done.stderr)[-3000:]}"
            )
    return path


class Emulator:
    name = ""
    provider = ""  # Sluice's (and AIStore's) name of the provider
    endpoint = ""

    @property
    def ais_provider(self) -> Any:
        """The aistore SDK's ``Provider`` member for it (``Provider.GOOGLE``, ``AZURE``)."""
        from aistore.sdk.provider import Provider

        return Provider(self.provider)

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"{self.name}-{self.port}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 60.0) -> Emulator:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if not k.startswith(("AZURE", "GOOGLE"))},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
            try:
                if self.ready():
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not ready in {timeout}s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    # -- seeding (the official client) -----------------------------------------------
    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def create_bucket(self, bucket: str) -> None:
        raise NotImplementedError

    def put(self, bucket: str, key: str, data: bytes) -> None:
        raise NotImplementedError

    def read(self, bucket: str, key: str) -> bytes | None:
        raise NotImplementedError

    def names(self, bucket: str) -> list[str]:
        raise NotImplementedError

    def delete(self, bucket: str, key: str) -> None:
        raise NotImplementedError


class FakeGcs(Emulator):
    """fake-gcs-server over http (``-scheme http``), its objects in memory."""

    name = "fake-gcs"
    provider = "gcp"
    PROJECT = "sluice-test"

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        super().__init__(data_dir, port)
        self.binary = ensure_tool(cache_dir() / "bin" / "fake-gcs-server", "fake-gcs.sh")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._client: Any = None

    def command(self) -> list[str]:
        return [
            str(self.binary),
            *("-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port)),
            # XML-API paths (obstore's GET/HEAD/list) answer only on the public host.
            *("-public-host", "127.0.0.1", "-external-url", self.endpoint),
            # In memory: a restart (the 503 test) starts empty. On disk, a missing
            # bucket's listing is a 500 naming the emulator's directory.
            *("-backend", "memory"),
            *("-log-level", "warn"),
        ]

    def ready(self) -> bool:
        return httpx.get(f"{self.endpoint}/_internal/healthcheck", timeout=1).status_code == 200

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": self.PROJECT}

    def client(self) -> Any:
        if self._client is None:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            self._client = storage.Client(
                project=self.PROJECT,
                credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                client_options={"api_endpoint": self.endpoint},
            )
        return self._client

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(bucket)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().bucket(bucket).blob(key).upload_from_string(data)

    def read(self, bucket: str, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return bytes(self.client().bucket(bucket).blob(key).download_as_bytes())
        except NotFound:
            return None

    def names(self, bucket: str) -> list[str]:
        return sorted(b.name for b in self.client().list_blobs(bucket))

    def delete(self, bucket: str, key: str) -> None:
        self.client().bucket(bucket).blob(key).delete()


class Azurite(Emulator):
    """Azurite's blob service (``azurite-blob``) with its well-known account."""

    name = "azurite"
    provider = "azure"

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        super().__init__(data_dir, port)
        launcher = cache_dir() / "tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
        self.binary = ensure_tool(launcher, "azurite.sh")
        self.node = shutil.which("node") or "node"
        self.endpoint = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        self._client: Any = None

    def command(self) -> list[str]:
        return [
            str(self.binary),
            *("--blobHost", "127.0.0.1", "--blobPort", str(self.port)),
            *("--location", str(self.data_dir), "--silent", "--skipApiVersionCheck"),
        ]

    def ready(self) -> bool:
        # Any answer of the blob service means it is listening (400/403 without auth).
        return httpx.get(self.endpoint, timeout=1).status_code < 500

    def env(self) -> dict[str, str]:
        return {
            "AZURE_STORAGE_ENDPOINT": self.endpoint,
            "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
        }

    def client(self) -> Any:
        if self._client is None:
            from azure.storage.blob import BlobServiceClient

            self._client = BlobServiceClient.from_connection_string(
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint};"
            )
        return self._client

    def create_bucket(self, bucket: str) -> None:
        self.client().create_container(bucket)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().get_blob_client(bucket, key).upload_blob(data, overwrite=True)

    def read(self, bucket: str, key: str) -> bytes | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return bytes(self.client().get_blob_client(bucket, key).download_blob().readall())
        except ResourceNotFoundError:
            return None

    def names(self, bucket: str) -> list[str]:
        return sorted(b.name for b in self.client().get_container_client(bucket).list_blobs())

    def delete(self, bucket: str, key: str) -> None:
        self.client().get_blob_client(bucket, key).delete_blob()
