"""A real MinIO server on loopback (built by scripts/minio.sh), for tests and bench/remote.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx

from tests.servers import free_port

ACCESS_KEY = "sluice-test"
SECRET_KEY = "sluice-test-secret"
REGION = "us-east-1"


def minio_binary() -> Path:
    cache = Path(os.environ.get("SLUICE_CACHE") or Path.home() / ".cache" / "sluice")
    return cache / "bin" / "minio"


class MinioServer:
    """``minio server DATA`` on 127.0.0.1:<port>; ``stop()``/``start()`` keep port and data."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.binary = minio_binary()
        if not self.binary.is_file():
            raise RuntimeError(
                f"MinIO is not built ({self.binary} missing): run `make minio` "
                "(bash scripts/minio.sh); `make test` builds it"
            )
        self.data_dir = data_dir
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"minio-{self.port}.log"

    def env(self) -> dict[str, str]:
        """The AWS environment a client of this server uses."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }

    def start(self, timeout: float = 60.0) -> MinioServer:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MINIO_"))},
            "MINIO_ROOT_USER": ACCESS_KEY,
            "MINIO_ROOT_PASSWORD": SECRET_KEY,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
        }
        console = free_port()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "server", str(self.data_dir), "--quiet"]
                + ["--address", f"127.0.0.1:{self.port}"]
                + ["--console-address", f"127.0.0.1:{console}"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"MinIO exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.endpoint}/minio/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"MinIO did not get ready in {timeout}s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def client(self):  # type: ignore[no-untyped-def]
        """A boto3 S3 client of this server (to seed and inspect buckets)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )
