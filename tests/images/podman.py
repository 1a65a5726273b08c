"""Build the images with ``scripts/images.sh`` and run them with podman + runc.

``build_images()`` runs the cached build (``make images``; seconds when
nothing changed) and returns its ``index.json``. ``Container`` runs one
container the way the chart's securityContext does: as the image's USER
(which must be the non-root UID 10001, as the chart's runAsUser), read-only
root filesystem, no capabilities, no privilege escalation; host network, so
the servers listen on 127.0.0.1. podman here needs runc (crun cannot start
containers on this cgroup layout) and explicit ulimits.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.servers import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "images.sh"
CACHE = Path(os.environ.get("SLUICE_IMAGES_CACHE", Path.home() / ".cache/sluice/images"))
TAG = os.environ.get("SLUICE_IMAGES_TAG", "dev")
UID = 10001
BUILD_TIMEOUT = 3600.0  # cold, on a loaded 2-core machine: base + three images
PODMAN = ["podman", "run", "--runtime", "runc"]
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]


def ref(name: str) -> str:
    return f"localhost/sluice/{name}:{TAG}"


def build_images(*names: str) -> tuple[dict[str, Any], str]:
    """Run ``scripts/images.sh`` (installs podman & co. when missing); index and log."""
    proc = subprocess.run(
        ["bash", str(SCRIPT), *names],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        cwd=REPO,
    )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"scripts/images.sh failed ({proc.returncode}):\n{log[-6000:]}")
    index = json.loads((CACHE / "index.json").read_text())
    return index, log


def podman(*args: str, timeout: float = 120.0, check: bool = True) -> str:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc.stdout


def run_once(image: str, *argv: str, entrypoint: str | None = None) -> subprocess.CompletedProcess:
    """``podman run --rm`` under the chart's securityContext; the finished process."""
    cmd = [*PODMAN, "--rm", *ULIMITS, *secure_flags()]
    if entrypoint is not None:
        cmd += ["--entrypoint", entrypoint]
    return subprocess.run([*cmd, ref(image), *argv], capture_output=True, text=True, timeout=300)


def secure_flags() -> list[str]:
    """The chart's containerSecurityContext, as podman flags.

    No ``--user``: the image's own ``USER`` must be the non-root 10001 (the
    chart's runAsUser is the same). ``--read-only-tmpfs=false``: podman would
    otherwise put writable tmpfs on /tmp, /run and /var/tmp; the chart mounts
    only what it lists (``--tmpfs`` here).
    """
    return [
        "--read-only", "--read-only-tmpfs=false",
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
    ]  # fmt: skip


class Container:
    """One detached container; ``stop()`` removes it (logs are kept for failures)."""

    def __init__(
        self,
        image: str,
        argv: Sequence[str] = (),
        *,
        entrypoint: str | None = None,
        env: dict[str, str] | None = None,
        volumes: dict[str, str] | None = None,  # host path -> container path
        tmpfs: Sequence[str] = ("/tmp",),
        name: str = "",
    ) -> None:
        self.name = f"sluice-test-{name or image}-{uuid.uuid4().hex[:8]}"
        cmd = [*PODMAN, "-d", "--name", self.name, "--network", "host", *ULIMITS]
        cmd += secure_flags()
        for path in tmpfs:
            cmd += ["--tmpfs", f"{path}:rw,size=256m,mode=1777"]
        for host, inside in (volumes or {}).items():
            cmd += ["--volume", f"{host}:{inside}"]
        for key, value in (env or {}).items():
            cmd += ["--env", f"{key}={value}"]
        if entrypoint is not None:
            cmd += ["--entrypoint", entrypoint]
        proc = subprocess.run(
            [*cmd, ref(image), *argv], capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            subprocess.run(["podman", "rm", "-f", self.name], capture_output=True, timeout=60)
            raise AssertionError(f"podman run {self.name}: {proc.stderr[-3000:]}")

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        subprocess.run(
            ["podman", "rm", "-f", "-t", "5", self.name], capture_output=True, timeout=120
        )

    def logs(self) -> str:
        proc = subprocess.run(
            ["podman", "logs", self.name], capture_output=True, text=True, timeout=60
        )
        return (proc.stdout + proc.stderr)[-4000:]

    def state(self) -> dict[str, Any]:
        out = podman("inspect", "--format", "{{json .State}}", self.name)
        state: dict[str, Any] = json.loads(out)
        return state

    def pid(self) -> int:
        return int(self.state()["Pid"])

    def proc_ids(self) -> tuple[int, int]:
        """Real UID and GID of the container's main process, as the host kernel sees it."""
        status = Path(f"/proc/{self.pid()}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])

    def exec(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["podman", "exec", self.name, *argv], capture_output=True, text=True, timeout=60
        )

    def wait_http(self, url: str, timeout: float = 120.0) -> None:
        """Until ``url`` answers 200 from this container; fails early with the logs if it exits.

        Host network: another test's server may hold the port ``free_port()``
        chose, and would answer in this container's place. An answer counts
        only when the socket listening on the port belongs to this container's
        processes; if the container could not bind it, ``PortTaken``.
        """
        port = urlsplit(url).port
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self.state().get("Running"):
                logs = self.logs()
                if "address already in use" in logs.lower():
                    raise PortTaken(f"{self.name}: port {port} was taken:\n{logs}")
                raise AssertionError(f"{self.name} exited:\n{logs}")
            try:
                r = httpx.get(url, timeout=5.0)
                if r.status_code == 200 and port is not None and self.listens_on(port):
                    return
                last = f"{r.status_code} {r.text[:300]}"
            except httpx.HTTPError as e:
                last = repr(e)
            time.sleep(0.5)
        raise AssertionError(f"{url} not ready after {timeout:.0f} s ({last}):\n{self.logs()}")

    def listens_on(self, port: int) -> bool:
        """Whether a process of this container holds the listening socket on ``port``."""
        root = self.pid()
        return any(_descends_from(pid, root) for pid in _listeners(port))


class PortTaken(AssertionError):
    """The container exited because another process held its port: start it on another."""


def _listeners(port: int) -> set[int]:
    """PIDs holding a TCP socket listening on ``port`` (any address), from /proc."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{inode}]")
    pids: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                pids.add(int(proc.name))
        except OSError:
            continue
    return pids


def _descends_from(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid = int(fields["PPid"].strip())
    return False


def serving(
    stack: ExitStack, start: Callable[[int], Container], path: str = "/v1/health"
) -> tuple[Container, int]:
    """``start(port)`` on a free port until it serves ``path`` there (another port if taken).

    The container is stopped when ``stack`` closes.
    """
    for _ in range(4):
        port = free_port()
        container = stack.enter_context(start(port))
        try:
            container.wait_http(f"http://127.0.0.1:{port}{path}")
            return container, port
        except PortTaken:
            container.stop()
    raise AssertionError("no free port held long enough to start a container on it")


def owned_dir(path: Path) -> Path:
    """A host directory the container's UID may write (a volume, as fsGroup makes it)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, UID, UID)
    return path
