"""One container of a pod, run as a local process by the process kubelet.

Owns the process, its log file, restarts with exponential back-off, probes
(httpGet / tcpSocket / exec; startup, readiness and liveness) and the
Kubernetes ``containerStatuses[]`` entry that describes it, including
``lastState`` and, with ``terminationMessagePolicy: FallbackToLogsOnError``,
the tail of the output as the termination message of a failed run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tests.k8s.controlplane import DIE_WITH_PARENT  # the pod worker outlives its processes
from tests.k8s.podspec import Launch

JSON = dict[str, Any]
TAIL_LINES, TAIL_BYTES = 80, 2048  # what the real kubelet keeps for the message


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Probe:
    """Schedule and counters of one probe (startup, readiness or liveness)."""

    spec: JSON
    period_cap: float
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0

    def reset(self, started: float) -> None:
        self.next_at = started + float(self.spec.get("initialDelaySeconds", 0))
        self.successes = self.failures = 0

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, now: float, ok: bool) -> bool | None:
        """Count one result; True/False once a threshold is crossed, else None."""
        self.next_at = now + min(float(self.spec.get("periodSeconds", 10)), self.period_cap)
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            return True if self.successes >= int(self.spec.get("successThreshold", 1)) else None
        self.failures, self.successes = self.failures + 1, 0
        return False if self.failures >= int(self.spec.get("failureThreshold", 3)) else None


def run_probe(spec: JSON, container: JSON, pod_ip: str, env: dict[str, str]) -> bool:
    """One probe attempt against the container; True when it succeeds."""
    timeout = float(spec.get("timeoutSeconds", 1))

    def port_of(port: int | str) -> int:
        if isinstance(port, int) or port.isdigit():
            return int(port)
        for p in container.get("ports", []):
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"unknown named port {port!r}")

    try:
        if "httpGet" in spec:
            h = spec["httpGet"]
            url = f"{h.get('scheme', 'HTTP').lower()}://{h.get('host') or pod_ip}:"
            url += f"{port_of(h['port'])}{h.get('path', '/')}"
            headers = {x["name"]: x["value"] for x in h.get("httpHeaders", [])}
            r = httpx.get(url, headers=headers, timeout=timeout, verify=False)
            return 200 <= r.status_code < 400
        if "tcpSocket" in spec:
            t = spec["tcpSocket"]
            with socket.create_connection((t.get("host") or pod_ip, port_of(t["port"])), timeout):
                return True
        if "exec" in spec:
            cmd = spec["exec"]["command"]
            done = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True)
            return done.returncode == 0
    except (OSError, httpx.HTTPError, subprocess.TimeoutExpired, ValueError):
        return False
    return False  # grpc and unknown handlers: not supported, never succeed


@dataclass
class Container:
    """Runtime state of one container; driven by the pod worker's loop."""

    spec: JSON
    log_path: Path
    probe_period_cap: float = 1.0
    proc: subprocess.Popen[bytes] | None = None
    restart_count: int = 0
    runs: int = 0
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: JSON = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    next_start: float = 0.0
    exit_code: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    probes: dict[str, Probe] = field(default_factory=dict)
    _log_offset: int = 0
    _started_at: str = ""

    def __post_init__(self) -> None:
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in self.spec:
                self.probes[kind] = Probe(self.spec[kind], self.probe_period_cap)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, launch: Launch) -> None:
        """Start (or restart) the process; output goes to the log file."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            self.proc = subprocess.Popen(
                [*DIE_WITH_PARENT, *launch.argv],
                env=launch.env,
                cwd=launch.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.env = launch.env
        self.runs += 1
        self.restart_count = self.runs - 1
        self._started_at = now_iso()
        self.state = {"running": {"startedAt": self._started_at}}
        self.exit_code = None
        self.started = "startupProbe" not in self.probes
        self.ready = False
        t = time.monotonic()
        for p in self.probes.values():
            p.reset(t)

    def waiting(self, reason: str, message: str = "") -> None:
        self.state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}

    def poll(self) -> bool:
        """Notice a process exit; True if the container just terminated."""
        if self.proc is None or self.proc.poll() is None:
            return False
        code = self.proc.returncode
        code = 128 - code if code < 0 else code  # killed by a signal
        self.proc, self.exit_code, self.ready = None, code, False
        term: JSON = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self._started_at,
            "finishedAt": now_iso(),
        }
        policy = self.spec.get("terminationMessagePolicy", "File")
        if code != 0 and policy == "FallbackToLogsOnError":
            term["message"] = self.log_tail()
        self.state = {"terminated": term}
        return True

    def log_tail(self) -> str:
        """The last lines this run wrote (as the kubelet's FallbackToLogsOnError)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return ""
        lines = data.decode("utf-8", "replace").splitlines()[-TAIL_LINES:]
        return "\n".join(lines)[-TAIL_BYTES:]

    def archive(self) -> None:
        """Before a restart: the terminated state becomes ``lastState``.

        ``restartCount`` goes up when the process is started again (``start``).
        """
        if "terminated" in self.state:
            self.last_state = self.state

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float) -> None:
        """SIGTERM, wait up to ``grace`` seconds, SIGKILL.

        The exit is left for ``poll()`` so the pod worker applies the restart policy.
        """
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.running and time.monotonic() < deadline:
            time.sleep(0.05)
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def run_probes(self, pod_ip: str) -> None:
        """Run the probes that are due; a failed liveness probe kills the process."""
        if not self.running:
            return
        now = time.monotonic()
        startup = self.probes.get("startupProbe")
        if not self.started and startup is not None:
            if startup.due(now):
                result = startup.record(now, run_probe(startup.spec, self.spec, pod_ip, self.env))
                if result is False:
                    self.stop(grace=float(startup.spec.get("terminationGracePeriodSeconds", 2)))
                self.started = bool(result)
            return
        readiness = self.probes.get("readinessProbe")
        if readiness is None:
            self.ready = True
        elif readiness.due(now):
            result = readiness.record(now, run_probe(readiness.spec, self.spec, pod_ip, self.env))
            if result is not None:
                self.ready = result
        liveness = self.probes.get("livenessProbe")
        if liveness is not None and liveness.due(now):
            if liveness.record(now, run_probe(liveness.spec, self.spec, pod_ip, self.env)) is False:
                self.stop(grace=float(liveness.spec.get("terminationGracePeriodSeconds", 2)))

    def status(self, image: str) -> JSON:
        """This container's ``containerStatuses[]`` entry."""
        st: JSON = {
            "name": self.name,
            "image": image,
            "imageID": "",
            "ready": self.ready and self.running,
            "started": self.started and self.running,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.proc is not None:
            st["containerID"] = f"process://{self.proc.pid}"
        return st
