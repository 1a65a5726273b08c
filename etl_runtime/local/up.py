"""``sluice up``: a whole Sluice cluster on one machine, as child processes.

``main(argv)`` runs ``up --targets N --port P --data-dir DIR [--token T]``:

* ``DIR/cluster-key`` (mode 0600) is created once and reused, so tokens and
  signed redirects stay valid across restarts;
* N targets (``python -m etl_runtime.storage_target``, data in ``DIR/targets/tI``,
  registry ``file:DIR/etl``) start on free ports, then the gateway
  (``python -m etl_runtime.gateway``, port P, state in ``DIR/etl``), which runs
  the local ETL controller and so the transformers (in a data dir never used
  before, beside the targets rather than once they answer);
* once everything answers ``/v1/health`` it prints ``Sluice is up: URL``;
* a child that dies on its own is restarted with the same command (a target
  keeps its id, port and data dir; the gateway its port, and adopts the
  transformers that are still running) after a back-off of 0.5 s, 1 s, 2 s, ...
  (10 s at most; it starts over once the child stayed up ``--restart-reset``
  seconds); each restart is one ``sluice: ...`` line on stderr. A target that
  crashes 5 times in a row is marked *down*: the rest of the cluster keeps
  serving (objects with a copy elsewhere stay readable), the target is tried
  again every ``--down-retry`` seconds (60), and ``run/down.json`` tells the
  gateway why (``sluice cluster``, ``/ui``, ``sluice_target_down``). After 5
  crashes in a row of the gateway the cluster is taken down with a non-zero
  exit that names it and why it died;
* SIGINT/SIGTERM stops the gateway (and with it the transformers), then the
  targets, and exits 0.

ETLs (``DIR/etl/*.json``) and objects survive a restart. Server logs are in
``DIR/logs/``, transformer logs in ``DIR/etl/logs/``.

``LocalCluster`` runs the same command in a subprocess for tests and demos.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import httpx

from etl_runtime.core import auth, oidc, procs, tls
from etl_runtime.local import runas, sandbox, supervisor
from etl_runtime.local.api import LocalCluster
from etl_runtime.local.pidfiles import pid_dir, read_pid_files
from etl_runtime.local.processes import TransformerProcess, free_port
from etl_runtime.local.supervisor import Child

__all__ = ["LocalCluster", "main", "load_cluster_key"]

GATEWAY_GRACE = 25.0  # the gateway itself gives each transformer 10 s
TARGET_GRACE = 10.0
HEALTH_TIMEOUT = 120.0
RESTART_RESET = 30.0  # seconds up after which a child's crash count starts over
TARGET_DOWN_RETRY = 60.0  # a target marked down (crash loop) is tried again this often
# passed on to the servers: remote buckets' settings, the ETL output cache's budget, the
# zygote's mode, the event loop every server runs on (core/eventloop.py), podman's use,
# who assembles a GetBatch (gateway/getbatch_routes.py)
PASSED_ENV = (
    "SLUICE_SECRETS_DIR",
    "SLUICE_REMOTE_",
    "SLUICE_ETL_CACHE_BYTES",
    "SLUICE_ZYGOTE",
    "SLUICE_LOOP",
    "SLUICE_PODMAN",
    "SLUICE_BATCH_ASSEMBLY",
    "SLUICE_OIDC_",  # JWTs of an OIDC issuer (core/oidc.py): claim, admin value, CA, refresh
    "SLUICE_S3_",  # the S3 API: SLUICE_S3_UPLOAD_TTL (targets), SLUICE_S3_DOMAIN (gateway)
    "SLUICE_VERIFY_READS",  # storage/integrity.py: reads' checksum checks (on unless 0)
    "SLUICE_SCRUB_MBPS",  # jobs/scrub.py: the scrub's read rate per target
    "SLUICE_HEDGE_AFTER",  # gateway/s3/hedge.py: when the S3 relay asks a copy
    "SLUICE_EVENTS",  # storage_target: targets record their findings as Kubernetes Events
    "SLUICE_NAMESPACE",  # ... in this namespace (cluster/kube/events.py)
)


class StartupFailed(RuntimeError):
    """A server of the local cluster did not come up; the message says which and why."""


def load_cluster_key(path: Path) -> str:
    """Read ``path``, or create it (0600) with a new random key."""
    try:
        key = path.read_text().strip()
        if key:
            os.chmod(path, 0o600)
            return key
    except FileNotFoundError:
        pass
    key = auth.new_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, 0o600)
    return key


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sluice up",
        description="Run a local Sluice cluster: gateway + targets.",
        epilog="Examples:\n"
        "  sluice up --targets 3 --port 8080 --data-dir ./sluice-data\n"
        "  sluice up --targets 1 --token s3cret --read-token r3ad   # reads need a token too\n"
        "  then open http://127.0.0.1:8080/ui for the status page",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--targets", type=int, default=3, help="number of storage targets")
    p.add_argument("--port", type=int, default=8080, help="gateway port (0: pick a free one)")
    p.add_argument("--data-dir", default="./sluice-data", help="objects, ETLs, logs, cluster key")
    p.add_argument("--token", default=os.environ.get("SLUICE_TOKEN"), help="user token")
    p.add_argument(
        "--read-token",
        default=os.environ.get("SLUICE_READ_TOKEN"),
        help="if set, reads (GET, HEAD, listings, ETL details) need it or --token",
    )
    oidc.add_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address the servers bind to")
    p.add_argument(
        "--restart-reset",
        type=float,
        default=float(os.environ.get("SLUICE_RESTART_RESET", RESTART_RESET)),
        metavar="SECONDS",
        help="a crashed server that had stayed up this long starts a fresh back-off "
        f"and crash count (default {RESTART_RESET:g})",
    )
    p.add_argument(
        "--down-retry",
        type=float,
        default=float(os.environ.get("SLUICE_DOWN_RETRY", TARGET_DOWN_RETRY)),
        metavar="SECONDS",
        help="a target marked down after 5 crashes in a row is tried again this often "
        f"while the rest keeps serving (default {TARGET_DOWN_RETRY:g})",
    )
    p.add_argument(
        "--transformer-user",
        default=os.environ.get(runas.USER_ENV),
        metavar="USER",
        help="when run as root: the one user every ETL's code runs as (default: a uid of "
        "its own for each ETL, so that it cannot read the cluster key nor reach another "
        "ETL; 'root': as the servers)",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        default=os.environ.get("SLUICE_TLS", "") not in ("", "0", "false"),
        help="HTTPS on every server: a CA and a certificate per server are made under "
        "DATA_DIR/tls/ (clients trust DATA_DIR/tls/ca.crt), unless --cert/--key are given",
    )
    p.add_argument("--cert", metavar="PEM", help="with --key: the certificate every server uses")
    p.add_argument("--key", metavar="PEM", help="the private key of --cert")
    p.add_argument("--ca", metavar="PEM", help="the CA that signed --cert (internal hops verify)")
    args = p.parse_args(argv)
    if bool(args.cert) != bool(args.key):
        p.error("--cert and --key go together")
    if args.ca and not args.cert:
        p.error("--ca is the CA of --cert: give --cert and --key too")
    args.tls = args.tls or bool(args.cert)
    problem = oidc.flags_problem(args)
    if problem:
        p.error(problem)
    if args.down_retry <= 0:
        p.error("--down-retry must be positive")
    if args.targets < 1:
        p.error("--targets must be at least 1")
    if args.restart_reset < 0:
        p.error("--restart-reset must not be negative")
    return args


class Supervisor:
    """The processes of one ``sluice up`` and their orderly start and stop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data = Path(args.data_dir).resolve()
        self.url_host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        self.targets: list[Child] = []
        self.members: list[str] = []
        self.gateway: Child | None = None
        self.run_as: runas.Choice = None
        self.run_as_line = ""
        self.signals = 0
        self.certs: dict[str, tuple[str, str]] = {}  # server -> (cert, key): --tls
        self.ca: str | None = None

    # -- signals ---------------------------------------------------------------

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1

    def hurry(self) -> bool:
        return self.signals >= 2  # a second Ctrl-C: stop waiting for graceful exits

    # -- start -------------------------------------------------------------------

    def env(self, key: str) -> dict[str, str]:
        # AWS_* (remote buckets' endpoint and keys) pass through like the rest;
        # of SLUICE_*, only those of PASSED_ENV: the remote-bucket settings
        # (etl_runtime/providers/), the ETL output cache's budget, the zygote's, the
        # read checks' and the scrub's.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("SLUICE_") or k.startswith(PASSED_ENV)
        }
        env["SLUICE_CLUSTER_KEY"] = key
        env[procs.SUPERVISOR_ENV] = str(os.getpid())  # transformers outlive a killed gateway
        env["PYTHONUNBUFFERED"] = "1"
        env["SLUICE_ETL_FQN"] = "always"  # local transformers read the targets' files
        if os.environ.get("SLUICE_LOCAL_FILES") != "0":  # S3 GETs from the owner's open file
            env["SLUICE_LOCAL_FILES"] = str(self.data / "sock")  # (storage_target/handoff.py)
        if self.args.token:
            env["SLUICE_TOKEN"] = self.args.token
        if self.args.read_token:
            env["SLUICE_READ_TOKEN"] = self.args.read_token
        oidc.put_env(env, self.args)  # SLUICE_OIDC_* from the flags
        return env

    @property
    def scheme(self) -> str:
        return "https" if self.args.tls else "http"

    def make_certs(self, names: Sequence[str]) -> None:
        """``--tls``: the CA and a certificate per server under ``DIR/tls`` (``local/certs.py``),
        or ``--cert``/``--key``/``--ca`` for every server."""
        if self.args.cert:
            pair = (str(Path(self.args.cert).resolve()), str(Path(self.args.key).resolve()))
            self.certs = dict.fromkeys(names, pair)
            self.ca = str(Path(self.args.ca).resolve()) if self.args.ca else None
            return
        from etl_runtime.local import certs

        where = self.data / "tls"
        ca = certs.make_ca(where)
        os.chmod(where, 0o755)  # the transformers' user reads its certificate here
        self.ca = str(ca.cert)
        for name in names:
            made = certs.make_cert(where, name, ca, [self.url_host])
            self.certs[name] = (str(made.cert), str(made.key))

    def tls_env(self, name: str) -> dict[str, str]:
        """``SLUICE_TLS_CERT``/``KEY``/``SLUICE_CA`` for server ``name`` (core/tls.py)."""
        if not self.args.tls:
            return {}
        cert, key = self.certs[name]
        env = {tls.CERT_ENV: cert, tls.KEY_ENV: key}
        if self.ca:
            env[tls.CA_ENV] = self.ca
        if name == "gateway":  # its local ETL controller hands these to the transformers
            env[tls.TRANSFORMER_CERT_ENV], env[tls.TRANSFORMER_KEY_ENV] = self.certs["transformer"]
        return env

    def client(self, timeout: float) -> httpx.Client:
        verify = tls.client_context(self.ca) if self.args.tls else True
        held = self.args.token or self.args.read_token  # /v1/cluster needs one when set
        headers = {"Authorization": f"Bearer {held}"} if held else {}
        return httpx.Client(timeout=timeout, trust_env=False, verify=verify, headers=headers)

    def start(self) -> str:
        """Start targets, then the gateway; return the gateway URL once all are healthy."""
        # A data dir never used before holds no objects, buckets or ETLs the gateway
        # must see on every target at once (seeding the cluster map, a mirror's
        # repair): there the gateway starts beside the targets, not after them,
        # and its imports overlap theirs. (Asked first: the probe below makes targets/.)
        fresh = not (self.data / "targets").exists()
        key = load_cluster_key(self.data / "cluster-key")
        env = self.env(key)
        ids = [f"t{i}" for i in range(self.args.targets)] + self.leaving_ids()
        if self.args.tls:
            self.make_certs([*ids, "gateway", "transformer"])
        # Who runs ETL code: tried as that user while the targets start (local/runas.py).
        chosen: list[tuple[runas.Choice, str]] = []
        user = self.args.transformer_user
        probe = threading.Thread(target=lambda: chosen.append(runas.choose(user, self.data)))
        probe.start()
        logs, py, host = self.data / "logs", sys.executable, self.args.host
        cmap = f"file:{self.data / 'cluster.json'}"
        self.members = [f"t{i}" for i in range(self.args.targets)]
        for tid in ids:
            port = free_port(host)
            url = f"{self.scheme}://{self.url_host}:{port}"
            self.targets.append(
                Child(
                    name=f"target {tid}",
                    argv=[py, "-m", "etl_runtime.storage_target", "--id", tid, "--host", host]
                    + ["--port", str(port), "--data-dir", str(self.data / "targets" / tid)]
                    + ["--registry", f"file:{self.data / 'etl'}", "--cluster-map", cmap],
                    log_path=logs / f"{tid}.log",
                    health_url=f"{url}/v1/health",
                    policy=supervisor.RestartPolicy(down_delay=self.args.down_retry),
                )
            )
        for child in self.targets:
            tid = child.name.removeprefix("target ")
            # its file broker, for per-ETL uids if they are chosen (local/runas.py)
            broker = runas.target_env(user, self.data, tid)
            child.start({**env, **self.tls_env(tid), **broker})
        self.record_children()
        if not fresh:
            self.wait_healthy(self.targets)
        port = self.args.port or free_port(host)
        gateway_url = f"{self.scheme}://{self.url_host}:{port}"
        target_list = ",".join(
            f"{c.name.removeprefix('target ')}={c.health_url.removesuffix('/v1/health')}"
            for c in self.targets
        )
        probe.join()
        self.run_as, self.run_as_line = chosen[0] if chosen else (None, "")
        # the gateway's ETL controller spawns the transformers
        env = {**env, **runas.gateway_env(self.run_as)}
        self.lock_down()
        if isinstance(self.run_as, runas.Isolation) and self.args.tls and not self.args.cert:
            os.chown(self.certs["transformer"][1], 0, self.run_as.group)  # ETL uids only
            os.chmod(self.certs["transformer"][1], 0o640)
        elif (
            isinstance(self.run_as, runas.TransformerUser) and self.args.tls and not self.args.cert
        ):
            os.chown(self.certs["transformer"][1], self.run_as.uid, self.run_as.gid)  # 0600
        self.gateway = Child(
            name="gateway",
            argv=[py, "-m", "etl_runtime.gateway", "--host", host, "--port", str(port)]
            + ["--targets", target_list, "--state-dir", str(self.data / "etl")]
            + ["--cluster-map", cmap, "--members", ",".join(self.members)]
            + ["--down-file", str(self.down_file)],
            log_path=logs / "gateway.log",
            health_url=f"{gateway_url}/v1/health",
        )
        self.gateway.start({**env, **self.tls_env("gateway")})
        self.record_children()
        self.wait_healthy([*self.targets, self.gateway] if fresh else [self.gateway])
        if fresh:
            self.wait_gateway_sees_targets(gateway_url)
        return gateway_url

    def lock_down(self) -> None:
        """Per-ETL uids: what they may reach of the data dir (``local/sandbox.py``),
        again for what the servers made since."""
        if isinstance(self.run_as, runas.Isolation):
            with contextlib.suppress(OSError):
                sandbox.lock_down(self.data, self.run_as.group)

    def leaving_ids(self) -> list[str]:
        """Targets of an earlier run beyond ``--targets``: they hand their objects over."""
        found = []
        for d in (self.data / "targets").glob("t*"):
            if d.is_dir() and d.name[1:].isdigit() and int(d.name[1:]) >= self.args.targets:
                if any(p.is_file() for p in (d / "buckets").rglob("*")):
                    found.append(d.name)
        return sorted(found, key=lambda t: int(t[1:]))

    @property
    def down_file(self) -> Path:
        return self.data / "run" / "down.json"

    def record_down(self) -> None:
        """``run/down.json``: the targets marked down now, and why (the gateway reads it)."""
        down = {}
        for child in self.targets:
            if child.policy.down:
                down[child.name.removeprefix("target ")] = {
                    "reason": child.exit_reason()[:300] if child.exit_code() is not None else "",
                    "crashes": child.policy.crashes,
                    "retry_at": time.time() + max(0.0, (child.restart_at or 0) - time.monotonic()),
                }
        supervisor.write_down_file(self.down_file, down)

    def children(self) -> list[Child]:
        return ([self.gateway] if self.gateway else []) + self.targets

    def record_children(self) -> None:
        supervisor.write_children_file(self.data / "run" / "up.json", self.children())

    def wait_healthy(self, children: list[Child]) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT
        waiting = list(children)
        with self.client(2.0) as client:
            while waiting:
                if self.signals:
                    raise StartupFailed("interrupted while starting")
                for child in list(waiting):
                    if child.exit_code() is not None:
                        raise StartupFailed(child.describe_exit())
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(child.health_url).status_code == 200:
                            waiting.remove(child)
                if waiting and time.monotonic() > deadline:
                    names = ", ".join(c.name for c in waiting)
                    raise StartupFailed(f"{names} not healthy after {HEALTH_TIMEOUT:g}s")
                time.sleep(0.1)

    def wait_gateway_sees_targets(self, gateway_url: str) -> None:
        """Until the gateway's health loop counts every member alive (``/v1/cluster``):
        started beside the targets, it may have probed them before they listened."""
        deadline = time.monotonic() + HEALTH_TIMEOUT
        with self.client(5.0) as client:
            while time.monotonic() < deadline:
                if self.signals:
                    raise StartupFailed("interrupted while starting")
                if self.gateway is not None and self.gateway.exit_code() is not None:
                    raise StartupFailed(self.gateway.describe_exit())
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
                    view = client.get(f"{gateway_url}/v1/cluster").json()
                    alive = {t["id"] for t in view["targets"] if t.get("alive")}
                    if set(self.members) <= alive:
                        return
                time.sleep(0.05)
        raise StartupFailed(f"the gateway does not see targets {', '.join(self.members)} alive")

    # -- run and stop --------------------------------------------------------------

    def watch(self) -> Child | None:
        """Restart children that die; block until a signal arrives (None) or a
        child crashed ``max_crashes`` times in a row (that child)."""
        for child in self.children():
            child.policy.reset_after = self.args.restart_reset
        next_reap = 0.0
        while not self.signals:
            for child in self.children():
                if child.restart_due():
                    child.start(child.env)
                    self.record_children()
                elif child.restart_at is None and child.exit_code() is not None:
                    if self.crashed(child) is None:
                        return child
                elif child.restart_at is None and child.policy.settled(child.uptime()):
                    print(f"sluice: {child.name} is back up", file=sys.stderr, flush=True)
                    self.record_down()
            if time.monotonic() >= next_reap:  # a scan of /proc: not on every tick
                supervisor.reap_orphans({c.pid for c in self.children() if c.popen})
                self.lock_down()
                self.retire_leaving()
                next_reap = time.monotonic() + 1.0
            time.sleep(0.1)
        return None

    def retire_leaving(self) -> None:
        """Stop the targets beyond ``--targets`` once the rebalance moved their objects off."""
        leaving = [c for c in self.targets if c.name.removeprefix("target ") not in self.members]
        if not leaving or self.gateway is None:
            return
        try:
            with self.client(5.0) as client:
                view = client.get(
                    self.gateway.health_url.replace("/v1/health", "/v1/cluster")
                ).json()
        except (httpx.HTTPError, ValueError):
            return
        if view.get("rebalance", {}).get("state") != "idle":
            return
        status = {t["id"]: t.get("rebalance") or {} for t in view.get("targets", [])}
        for child in leaving:
            tid = child.name.removeprefix("target ")
            done = status.get(tid, {})
            if done.get("state") != "done" or done.get("rebalance_id") != view["rebalance"]["id"]:
                continue
            child.stop(TARGET_GRACE, self.hurry)
            self.targets.remove(child)
            self.record_children()
            print(
                f"sluice: {child.name} left the cluster: its objects moved to "
                f"{', '.join(self.members)}",
                file=sys.stderr,
                flush=True,
            )

    def crashed(self, child: Child) -> float | None:
        """Schedule the restart of a child that exited and say so; None: give up."""
        delay = child.schedule_restart()
        if delay is not None and child.policy.down:
            print(
                f"sluice: {child.name} is DOWN: crashed {child.policy.crashes} times in a row, "
                f"the last time: {child.describe_exit()[:400]}; the rest of the cluster keeps "
                f"serving; trying it again in {delay:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            self.record_children()
            self.record_down()
        elif delay is not None:
            print(
                f"sluice: {child.name} {child.exit_reason()[:300]}; restarting in {delay:.1f}s "
                f"(crash {child.policy.crashes} of {child.policy.max_crashes})",
                file=sys.stderr,
                flush=True,
            )
            self.record_children()
        return delay

    def stop(self) -> None:
        """Gateway first (it stops its transformers), then targets, then sweep."""
        if self.gateway is not None:
            self.gateway.stop(GATEWAY_GRACE, self.hurry)
        self.stop_leftover_transformers()
        for child in self.targets:
            child.signal(signal.SIGTERM)
        for child in self.targets:
            child.stop(TARGET_GRACE, self.hurry)
        supervisor.sweep_descendants({c.pid for c in self.children() if c.popen})
        (self.data / "run" / "up.json").unlink(missing_ok=True)
        self.down_file.unlink(missing_ok=True)

    def stop_leftover_transformers(self) -> None:
        """Transformers a dead gateway could not stop (their pid files remain)."""
        for path, data in read_pid_files(self.data / "etl"):
            proc = TransformerProcess.adopt(data)
            if proc is not None:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, sig)
                    time.sleep(0.5 if sig == signal.SIGTERM else 0)
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            pid_dir(self.data / "etl").rmdir()


def main(argv: Sequence[str] | None = None) -> int:
    """``sluice up ...``; ``argv`` may start with ``up``. Returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["up"]:
        argv = argv[1:]
    args = parse_args(argv)
    sup = Supervisor(args)
    sup.data.mkdir(parents=True, exist_ok=True)
    lock = open(sup.data / ".sluice-up.lock", "a")  # held (locked) for our lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"sluice: another 'sluice up' is using {sup.data}", file=sys.stderr)
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, sup.on_signal)
    supervisor.become_subreaper()
    stale = supervisor.stop_stale_children(sup.data / "run" / "up.json")
    if stale:
        print(f"sluice: stopped leftovers of an earlier run: {', '.join(stale)}", file=sys.stderr)
    code = 0
    try:
        url = sup.start()
        print(sup.run_as_line, file=sys.stderr, flush=True)
        if args.tls:
            trust = f"clients trust {sup.ca}" if sup.ca else "clients verify with the system's CAs"
            print(f"sluice: HTTPS on every server; {trust}", file=sys.stderr, flush=True)
        print(f"Sluice is up: {url}", flush=True)
        print(
            f"sluice: {args.targets} target(s), data in {sup.data}, logs in {sup.data / 'logs'}",
            file=sys.stderr,
            flush=True,
        )
        died = sup.watch()
        if died is not None:
            print(
                f"sluice: {died.name} crashed {died.policy.crashes} times in a row, the last "
                f"time: {died.describe_exit()}; shutting down",
                file=sys.stderr,
                flush=True,
            )
            code = 1
    except StartupFailed as e:
        print(f"sluice: could not start the local cluster: {e}", file=sys.stderr, flush=True)
        code = 0 if sup.signals else 1
    finally:
        sup.stop()
        lock.close()
    return code
