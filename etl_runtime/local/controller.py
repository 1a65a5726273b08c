"""The local ETL controller: the gateway's ``EtlBackend`` when there is no Kubernetes.

It plays the operator's part on a laptop. ETL specs live as JSON records in the
state directory (``FileRegistry``), where the targets read them; the controller
keeps one ``python -m etl_runtime.webserver`` child per ETL and live target (a
podman container for an ETL image: ``containers.py``) and writes what it sees
(phase, message, per-target endpoint and readiness) back into the record.

Each reconcile pass, run on every change, about once a second, and for an ETL
at once when one of its transformers exits (``_watch``: targets must stop
sending clients to a dead port before the next pass):

1. observe: poll every transformer process for exit and probe ``GET /health``;
2. decide: ``etl_runtime.cluster.reconcile.plan()`` -- the very function the operator
   uses for pods -- says which transformers to create and which to delete;
3. act: spawn processes (asyncio subprocesses: never blocking the loop) and stop
   others in the background, with two local refinements a kubelet/Deployment
   would provide on Kubernetes:
   * restart backoff: a transformer that crashed stays visible (and counted)
     for 1, 2, 4 ... 30 s before it is replaced, so a crash loop does not spin;
   * rolling replace: on a spec change the old transformer of a target keeps
     serving until its replacement answers ``/health`` (or fails);
4. report: ``reconcile.summarize()`` -> phase and message, written to the record
   only when something changed, so targets' caches stay warm.

Exit code 2 of a transformer is a permanent configuration error: it is left
dead, its last stderr line the ETL's message (phase Error), until the spec
changes or the ETL is stopped and started.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import httpx

from etl_runtime.cluster import reconcile
from etl_runtime.cluster.local.registry import FileRegistry
from etl_runtime.cluster.records import EtlRecord, TargetDiscovery, TargetInfo, TransformerStatus
from etl_runtime.core import auth, tls
from etl_runtime.core.eventloop import cancel_and_wait
from etl_runtime.core.spec import EtlSpec, validate_name
from etl_runtime.etl import grants
from etl_runtime.local import containers, pidfiles, processes, runas, sandbox, zygote
from etl_runtime.local.processes import TransformerProcess, restart_backoff
from etl_runtime.local.zygote import Zygotes

log = logging.getLogger(__name__)

PROBE_FAILURES_TO_UNREADY = 3  # failed probes in a row: unready (one slow answer is not)
# In its first STARTING_WINDOW seconds a starting transformer is probed this often
# (else every ``interval``): Running is reported within this much of it being ready.
STARTING_PROBE_SECONDS = 0.05
STARTING_WINDOW = 10.0
# The transformer runtime; ``--host``/``--port`` are appended.
TRANSFORMER_COMMAND = (sys.executable, "-m", "etl_runtime.webserver")


class LocalEtlBackend:
    """``EtlBackend`` that runs transformers as local child processes."""

    platform = "local"  # what the gateway's refusals say (gateway/aisetl.py)

    def __init__(
        self,
        state_dir: Path | str,
        discovery: TargetDiscovery,
        cluster_key: str,
        *,
        interval: float = 1.0,
        grace: float = 10.0,
        probe_timeout: float = 2.0,
        command: Sequence[str] = TRANSFORMER_COMMAND,
        zygote_mode: str = "off",
        run_as: runas.Choice = None,
    ) -> None:
        """``zygote_mode``: ``eager``, ``lazy`` or ``off`` (``local.zygote``; only
        for the default ``command``: it forks ``python -m etl_runtime.webserver``)."""
        self.state_dir = Path(state_dir)
        self.registry = FileRegistry(self.state_dir)
        self.discovery = discovery
        self.cluster_key = cluster_key
        self.interval = interval
        self.grace = grace
        self.probe_timeout = probe_timeout
        self.command = tuple(command)
        # Other OS users for ETL code, chosen by `sluice up` (local/runas.py): one
        # for every ETL (Isolation, with an interpreter they can run) or one for all.
        self.run_as = run_as if run_as is not None else runas.from_env()
        if isinstance(self.run_as, runas.Isolation) and self.command == TRANSFORMER_COMMAND:
            self.command = (self.run_as.python, "-m", "etl_runtime.webserver")
        self._records: dict[str, EtlRecord] = {}
        self._procs: dict[str, list[TransformerProcess]] = {}
        # (etl, target) -> (spec hash, crashes so far): carried into the replacement.
        # (ETL, target) -> spec hash, restarts, how the last run ended (shown while
        # the next one starts, so a crash loop's Error names its cause)
        self._restarts: dict[tuple[str, str], tuple[str, int, str | None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._watching: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._last_full_probe = 0.0
        # The zygote forks as this process's user, and drops a child to an ETL's own uid
        # (Isolation, run by their interpreter); none when all ETLs share one other user.
        iso = self.run_as if isinstance(self.run_as, runas.Isolation) else None
        python = iso.python if iso else sys.executable
        own = self.command in (TRANSFORMER_COMMAND, (python, "-m", "etl_runtime.webserver"))
        own = own and (self.run_as is None or iso is not None)
        self.zygote_mode = zygote_mode if own else "off"
        self.zygote: Zygotes | None = None
        if self.zygote_mode != "off":
            extra = {"PYTHONUNBUFFERED": "1", **(iso.env if iso else {})}
            env = processes.transformer_env(dict(os.environ), (), extra)
            if preload := os.environ.get("SLUICE_ZYGOTE_PRELOAD"):
                env["SLUICE_ZYGOTE_PRELOAD"] = preload
            self.zygote = Zygotes(self.state_dir, env, on_ready=self.kick, python=python)

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Load persisted ETLs, adopt surviving transformers, start reconciling."""
        if self._task is not None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._records = {r.name: r for r in await asyncio.to_thread(self.registry.list)}
        self._adopt()
        self._client = httpx.AsyncClient(
            timeout=self.probe_timeout, trust_env=False, verify=tls.client_context()
        )
        if self.zygote is not None and self.zygote_mode == "eager":
            await self.zygote.ensure()
        self._task = asyncio.create_task(self._loop(), name="sluice-local-etl-controller")

    async def stop(self) -> None:
        """Stop reconciling and terminate every transformer this controller runs."""
        await cancel_and_wait(self._task)
        self._task = None
        for watch in list(self._watching):
            await cancel_and_wait(watch)
        async with self._lock:
            everything = [p for procs in self._procs.values() for p in procs]
            self._procs.clear()
            for p in everything:
                self._stop_in_background(p)
            if self._stopping:
                await asyncio.gather(*self._stopping, return_exceptions=True)
            for rec in list(self._records.values()):
                if not rec.spec.stopped and rec.transformers:
                    idle = dataclasses.replace(
                        rec, phase="Initializing", message="local cluster is down", transformers=()
                    )
                    await self._save(idle)
        if any(r.spec.foreign for r in self._records.values()):
            await containers.remove_labelled(self.state_dir)  # any left by a crash
        if self.zygote is not None:
            await self.zygote.stop()  # after its transformers: it reports their exits
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _adopt(self) -> None:
        """Take over transformers left running by a controller that died."""
        for path, data in pidfiles.read_pid_files(self.state_dir):
            proc = TransformerProcess.adopt(data)
            if proc is None:
                path.unlink(missing_ok=True)
            elif proc.etl in self._records:
                log.info("adopting transformer %s (pid %d)", proc.name, proc.pid)
                self._procs.setdefault(proc.etl, []).append(proc)
                self._watch(proc)
            else:
                self._stop_in_background(proc)

    # -- EtlBackend -------------------------------------------------------------

    async def init(self, name: str, spec: EtlSpec) -> EtlRecord:
        validate_name(name)
        spec.validate()
        containers.check(name, spec)  # an ETL image needs podman here
        async with self._lock:
            old = self._records.get(name)
            if old is None:
                pending = tuple(
                    TransformerStatus(target=t.id, endpoint=None, ready=False, message="pending")
                    for t in self.discovery.targets()
                )
                record = EtlRecord(name=name, uid=uuid.uuid4().hex, spec=spec, transformers=pending)
            elif (
                old.spec.content_hash() == spec.content_hash() and old.spec.stopped == spec.stopped
            ):
                record = dataclasses.replace(old, spec=spec)
            else:
                # Keep the old transformers listed: they serve until replaced.
                record = dataclasses.replace(old, spec=spec, phase="Initializing", message=None)
            if spec.stopped:
                record = dataclasses.replace(
                    record, phase="Stopped", message="stopped by user", transformers=()
                )
            await self._save(record)
        self._wake.set()
        return record

    async def list(self) -> list[EtlRecord]:
        return [self._records[n] for n in sorted(self._records)]

    async def get(self, name: str) -> EtlRecord | None:
        return self._records.get(name)

    async def set_stopped(self, name: str, stopped: bool) -> EtlRecord:
        async with self._lock:
            old = self._records.get(name)
            if old is None:
                raise KeyError(name)
            if old.spec.stopped == stopped:
                return old
            spec = dataclasses.replace(old.spec, stopped=stopped)
            if stopped:
                record = dataclasses.replace(
                    old, spec=spec, phase="Stopped", message="stopped by user", transformers=()
                )
            else:
                record = dataclasses.replace(old, spec=spec, phase="Initializing", message=None)
                for key in [k for k in self._restarts if k[0] == name]:
                    del self._restarts[key]  # a fresh start gets a fresh crash budget
            await self._save(record)
        self._wake.set()
        return record

    async def delete(self, name: str) -> None:
        """Remove the record (targets stop routing), then its transformers."""
        async with self._lock:
            if name not in self._records:
                raise KeyError(name)
            foreign = self._records.pop(name).spec.foreign
            with contextlib.suppress(KeyError):
                await asyncio.to_thread(self.registry.delete, name)
            stops = [self._stop_in_background(p) for p in self._procs.pop(name, [])]
            for key in [k for k in self._restarts if k[0] == name]:
                del self._restarts[key]
        await asyncio.gather(*stops, return_exceptions=True)
        if foreign:
            await containers.remove_labelled(self.state_dir, name)
        await asyncio.to_thread(self._remove_deps, name)

    # -- reconcile ---------------------------------------------------------------

    def kick(self) -> None:
        """Ask for a reconcile pass now (e.g. the target set changed)."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:
                log.exception("local ETL reconcile pass failed")
            now = time.monotonic()
            starting = any(
                not p.ready and not p.terminated and now - p.started < STARTING_WINDOW
                for p in self._all_procs()
            )
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the
            # cancellation that stops this loop if a kick() lands at the same time.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STARTING_PROBE_SECONDS if starting else self.interval):
                    await self._wake.wait()
            self._wake.clear()

    def _all_procs(self) -> builtins.list[TransformerProcess]:
        return [p for procs in self._procs.values() for p in procs]

    async def reconcile(self) -> None:
        """One pass over every ETL: observe, plan, act, report.

        Starting transformers are probed on every pass, ready ones once per ``interval``."""
        now = time.monotonic()
        full = now - self._last_full_probe >= self.interval
        self._last_full_probe = now if full else self._last_full_probe
        snapshot = [p for procs in self._procs.values() for p in procs if full or not p.ready]
        await asyncio.gather(*(self._probe(p) for p in snapshot))  # no lock: slow-ish
        async with self._lock:
            targets = self.discovery.targets()
            for name in sorted(self._records):
                await self._reconcile_one(self._records[name], targets)

    async def _probe(self, p: TransformerProcess) -> None:
        if not p.poll() and self._client is not None:
            await p.probe(self._client, PROBE_FAILURES_TO_UNREADY)

    async def _reconcile_one(self, rec: EtlRecord, targets: builtins.list[TargetInfo]) -> None:
        spec, want = rec.spec, rec.spec.content_hash()
        procs = self._procs.setdefault(rec.name, [])
        now = time.monotonic()
        for p in procs:
            late = now - p.started > spec.init_timeout_seconds
            if late and p.kill_reason is None and not p.poll() and not p.ready:
                p.kill_reason = f"not ready after {spec.init_timeout_seconds:g}s (initSeconds)"
                p.message = p.kill_reason
                self._stop_in_background(p, keep_listed=True)
        observed = [p.observed() for p in procs]
        by_obs = {id(o): p for o, p in zip(observed, procs, strict=True)}
        todo = reconcile.plan(spec, targets, observed)

        victims = [by_obs[id(o)] for o in todo.delete]
        backing_off = {
            p.target
            for p in victims
            if self._is_transient(p, spec, want)
            and now
            < p.exited_at_or(now) + restart_backoff(reconcile.next_restarts(p.observed()) - 1)
        }
        for p in victims:
            if self._is_transient(p, spec, want) and p.target not in backing_off:
                again = reconcile.next_restarts(p.observed())
                self._restarts[(rec.name, p.target)] = (want, again, p.message)
        for target in todo.create:
            if target.id not in backing_off and (proc := await self._spawn(rec, target)):
                procs.append(self._watch(proc))
        # The rollout policy both actuators share: an old-spec transformer serves
        # until its replacement (spawned above) is ready.
        kept = reconcile.hold_for_rollout(todo, [p.observed() for p in procs], targets, want)
        held = {id(o) for o in todo.delete} - {id(o) for o in kept.delete}
        for o, p in zip(todo.delete, victims, strict=True):
            if p.target in backing_off and self._is_transient(p, spec, want):
                continue  # stays visible (and counted) until its backoff ends
            if id(o) in held:
                continue  # rolling replace: serve until the new one is ready
            procs.remove(p)
            self._stop_in_background(p)

        summary = reconcile.summarize(spec, targets, [p.observed() for p in procs])
        status = (
            tuple(processes.status_of(t, procs, want) for t in targets) if not spec.stopped else ()
        )
        new = dataclasses.replace(
            rec, phase=summary.phase, message=summary.message, transformers=status
        )
        if new != rec:
            await self._save(new)

    @staticmethod
    def _is_transient(p: TransformerProcess, spec: EtlSpec, want: str) -> bool:
        """A crash of a current transformer that a restart may fix."""
        return (
            p.terminated
            and p.exit_code != reconcile.EXIT_CONFIG_ERROR
            and p.spec_hash == want
            and not spec.stopped
        )

    def _watch(self, p: TransformerProcess) -> TransformerProcess:
        """Act on ``p``'s exit at once, not at the next pass: until the record says it
        is gone, targets send clients to its dead port (issue 20 #4b)."""

        async def run() -> None:
            await p.exited()
            async with self._lock:
                rec, procs = self._records.get(p.etl), self._procs.get(p.etl, [])
                if rec is not None and any(q is p for q in procs) and p.poll():
                    try:
                        await self._reconcile_one(rec, self.discovery.targets())
                    except Exception:
                        log.exception("reconcile of ETL %r after %s exited failed", p.etl, p.name)

        task = asyncio.create_task(run(), name=f"watch-{p.name}-{p.pid}")
        self._watching.add(task)
        task.add_done_callback(self._watching.discard)
        return p

    # -- actuation ----------------------------------------------------------------

    async def _spawn(self, rec: EtlRecord, target: TargetInfo) -> TransformerProcess | None:
        """Start the transformer of ``rec`` beside ``target``; None: not yet (the
        lite zygote is warming up: it kicks a pass when ready)."""
        z = None
        if self.zygote is not None and zygote.fits(rec.spec):
            await self.zygote.ensure()
            if self.zygote.warming:
                return None
            z = self.zygote.forker()
        name = reconcile.transformer_name(rec.name, target.id)
        want = rec.spec.content_hash()
        prev_hash, restarts, last_exit = self._restarts.get((rec.name, target.id), (want, 0, None))
        if prev_hash != want:
            restarts, last_exit = 0, None
        if rec.spec.foreign:  # the user's own image, under podman
            started = await containers.spawn(rec, target, name, restarts, self.state_dir)
            if started is not None:
                started.last_exit = last_exit
            return started
        deps = self.state_dir / "deps" / rec.name / target.id
        user = await asyncio.to_thread(self._user_of, rec.name)
        ours: dict[str, str] = {}
        if user is not None:  # it pip-installs `dependencies` there itself
            await asyncio.to_thread(user.own, deps.parent)
            await asyncio.to_thread(user.own, deps)
        if isinstance(self.run_as, runas.Isolation):  # a home of its own, not root's
            ours = {**self.run_as.env, "HOME": str(deps), "USER": user.name if user else ""}
            # its uid cannot open objects by path: its target hands it their files
            if sock := sandbox.broker_socket(self.state_dir.parent, target.id):
                ours[grants.ENV] = sock
        env = processes.transformer_env(
            dict(os.environ),
            rec.spec.env,
            {
                "SLUICE_ETL_NAME": rec.name,
                "SLUICE_ETL_SPEC": rec.spec.to_json(),
                "SLUICE_ETL_TOKEN": auth.transformer_token(self.cluster_key, rec.name, rec.uid),
                "SLUICE_DEPS_DIR": str(deps),
                # etl_fqn is confined to this target's data dir (DIR/targets/<id>,
                # beside our state dir DIR/etl); DIR/cluster-key lies outside it.
                "SLUICE_DATA_ROOTS": str(self.state_dir.parent / "targets" / target.id),
                "PYTHONUNBUFFERED": "1",
            }
            | ours
            | processes.supervisor_env()
            | tls.transformer_env(),  # HTTPS under sluice up --tls (core/tls.py)
        )
        proc = await processes.spawn(
            etl=rec.name,
            target=target.id,
            name=name,
            spec_hash=want,
            env=env,
            state_dir=self.state_dir,
            restarts=restarts,
            command=self.command,
            zygote=z,
            user=user,
        )
        proc.last_exit = last_exit
        log.info("started transformer %s (pid %d, port %d)", name, proc.pid, proc.port)
        return proc

    def _user_of(self, etl: str) -> runas.TransformerUser | None:
        """The OS user ETL ``etl`` runs as (None: ours)."""
        if isinstance(self.run_as, runas.Isolation):
            return self.run_as.user_for(self.state_dir, etl)
        return self.run_as

    def _stop_in_background(
        self, p: TransformerProcess, keep_listed: bool = False
    ) -> asyncio.Task[None]:
        """Terminate ``p`` without blocking the pass; ``stop()`` awaits these."""

        async def run() -> None:
            if cname := containers.is_container(p):
                await containers.remove(cname)  # podman run then exits
            await p.terminate(self.grace)
            if not keep_listed:
                pidfiles.remove_pid_file(self.state_dir, p)

        task = asyncio.create_task(run(), name=f"stop-{p.name}-{p.pid}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        return task

    async def _save(self, record: EtlRecord) -> None:
        await asyncio.to_thread(self.registry.write, record)
        self._records[record.name] = record

    def _remove_deps(self, etl: str) -> None:
        shutil.rmtree(self.state_dir / "deps" / etl, ignore_errors=True)
