"""``LocalCluster``: ``sluice up`` as a context manager, for tests, demos and notebooks.

::

    with LocalCluster("/tmp/sluice", targets=3) as cluster:
        client = Client(cluster.endpoint)

It runs ``python -m etl_runtime.local up ...`` in a subprocess (so signals,
process groups and clean-up are exactly those of the command line), waits for
``Sluice is up: URL`` and stops it with SIGTERM on exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

UP_LINE = "Sluice is up: "


class LocalCluster:
    """A local Sluice cluster (gateway + targets + transformers) in a child process."""

    def __init__(
        self,
        data_dir: Path | str,
        targets: int = 3,
        port: int = 0,
        token: str | None = None,
        host: str = "127.0.0.1",
        start_timeout: float = 180.0,
        read_token: str | None = None,
        tls: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.tls = tls  # sluice up --tls: HTTPS everywhere, clients trust ``ca``
        self.targets = targets
        self.port = port
        self.token = token
        self.read_token = read_token
        self.host = host
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.returncode: int | None = None
        self._lines: list[str] = []
        self._up = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def ca(self) -> str:
        """With ``tls=True``: the CA file (PEM) that signed every server's certificate."""
        return str((self.data_dir / "tls" / "ca.crt").resolve())

    @property
    def output(self) -> str:
        """Everything ``sluice up`` printed so far (stdout and stderr)."""
        return "".join(self._lines)

    @property
    def pid(self) -> int:
        """Process id of the running ``sluice up``."""
        if self.process is None:
            raise RuntimeError("the local cluster is not running")
        return self.process.pid

    def wait(self, timeout: float | None = None) -> int:
        """Wait for ``sluice up`` to exit by itself; its exit code."""
        if self.process is None:
            raise RuntimeError("the local cluster is not running")
        return self.process.wait(timeout)

    def start(self) -> LocalCluster:
        argv = [sys.executable, "-m", "etl_runtime.local", "up"]
        argv += ["--targets", str(self.targets), "--port", str(self.port)]
        argv += ["--data-dir", str(self.data_dir), "--host", self.host]
        env = dict(os.environ)
        # Tokens go in the environment: a command line is readable by every user
        # (/proc/PID/cmdline), ETL code included.
        env.pop("SLUICE_TOKEN", None)
        env.pop("SLUICE_READ_TOKEN", None)
        if self.token:
            env["SLUICE_TOKEN"] = self.token
        if self.read_token:
            env["SLUICE_READ_TOKEN"] = self.read_token
        env.pop("SLUICE_TLS", None)
        if self.tls:
            argv.append("--tls")
        self._up.clear()
        self._lines = []
        self.process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True, name="sluice-up-output")
        self._reader.start()
        if not self._up.wait(self.start_timeout) or not self.endpoint:
            self.stop()
            raise RuntimeError(f"sluice up did not come up:\n{self.output[-5000:]}")
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.append(line)
            if line.startswith(UP_LINE) and not self.endpoint:
                self.endpoint = line[len(UP_LINE) :].strip()
                self._up.set()
        self._up.set()  # exited: wake up start()

    def stop(self, timeout: float = 90.0) -> int:
        """SIGTERM and wait; returns the exit code (SIGKILL after ``timeout``)."""
        if self.process is None:
            return self.returncode if self.returncode is not None else 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
        self.returncode = self.process.returncode
        self.process = None
        self.endpoint = ""
        return self.returncode

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
