"""How long an ETL takes to start: ``init_code`` → Running → first transformed GET.

Starts a ``sluice up`` cluster (``LocalCluster``, ``--targets`` targets, 3 by
default), uploads one small object and one WebDataset shard (JPEGs), then
``--reps`` times, for each case:

* ``object``: a trivial object ETL (``def transform(data): return data``);
* ``wds``: a WebDataset ETL with ``decode="pil"`` whose function uses
  torchvision (a module-level ``import torchvision`` in this script, so the
  pickled function imports it when a worker loads it, as a user's would);

registers the ETL with ``client.etl(name).init_code(...)`` (the SDK's own wait
for Running), GETs the object or shard through it once (and checks the
answer), then deletes the ETL and lets the machine settle before the next.

Printed per case: ``init_code`` → Running and → first transformed GET, median
and max over the repetitions, and where the time went, each a median of the
*slowest* target's transformer (Running needs all of them), in seconds since
``init_code`` was called:

* ``PUT answered``: the gateway registered the ETL (``init_code(wait=False)``);
* ``process started``: the transformer's process exists (``/proc`` start time
  of the pid in the local controller's pid file: the controller's reaction
  plus the launcher, or the zygote's fork);
* ``server code imported``: the transformer's first log line (``main()`` runs:
  the interpreter and the server's imports are done);
* ``workers starting``: the transformer's ``starting N workers`` line;
* ``transformer ready``: its ``ETL ... ready`` line (every worker loaded the
  code: the worker helper (``forkserver`` before issue 23), preloads, the
  user's imports);
* ``record Running``: the gateway's record says Running (this script watches
  the record file every 5 ms: the controller's ``/health`` polling);
* ``SDK returned``: ``init_code`` came back (the SDK's polling of the phase).

The CPU seconds the transformer processes of one ETL spent (servers, the
worker helper and the workers, summed over targets; for a transformer forked
by the zygote, only what it spent after the fork) until the first GET answered
are printed too: on 2 shared cores, CPU is what the starts of several
transformers compete for.

    .venv/bin/python bench/etl_start.py [--reps 5] [--targets 3] [--cases object,wds]

``--cold`` measures a newcomer's first minute instead: per round, for the
default zygote and for ``SLUICE_ZYGOTE=off`` side by side, a ``sluice up`` in a
fresh data dir (a subprocess): the time until it prints ``Sluice is up``, then
``init_code`` → Running (the SDK's wait) of the first object ETL at once, and
of ``--next`` more one after another; medians over ``--rounds`` (3) rounds:

    .venv/bin/python bench/etl_start.py --cold [--rounds 3] [--next 2] [--targets 3]

``--arms bytecode`` compares, the same way, the venv's ``.pyc`` files used and
ignored (``PYTHONPYCACHEPREFIX`` at an empty directory, nothing written): a venv
installed without bytecode where ``PYTHONDONTWRITEBYTECODE`` is set. The CPU
seconds every server process (``sluice up`` and what it started) had spent when
the cluster was ready are printed beside the times.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from etl_runtime import Client  # noqa: E402
from etl_runtime.local.up import LocalCluster  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from loadgen import cpu_of as cpu_seconds  # noqa: E402

torchvision: Any = None  # imported in main() when the wds case runs (seconds)

STAGES = (
    "PUT answered",
    "process started",
    "server code imported",
    "workers starting",
    "transformer ready",
    "record Running",
    "SDK returned",
    "first GET answered",
)


def identity(data: bytes) -> bytes:
    return data


def thumbnail(sample: dict[str, Any]) -> dict[str, Any]:
    """wds, decode="pil": a 16x16 thumbnail through torchvision."""
    small = torchvision.transforms.functional.resize(sample["jpg"], [16, 16])
    return {"__key__": sample["__key__"], "jpg": small, "cls": sample["cls"]}


def make_shard(samples: int = 4) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(samples):
            img = io.BytesIO()
            Image.new("RGB", (64, 48), (i * 40, 80, 160)).save(img, "JPEG")
            for ext, data in (("jpg", img.getvalue()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# -- where the time went ------------------------------------------------------


def _boot_wall() -> float:
    """Wall-clock time of boot, to turn ``/proc/<pid>/stat`` start ticks into time."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def proc_start_wall(start_ticks: str | None) -> float | None:
    if not start_ticks:
        return None
    return _boot_wall() + int(start_ticks) / os.sysconf("SC_CLK_TCK")


def log_times(path: Path, after: float) -> dict[str, float]:
    """Wall times of the transformer's log lines that mark its start-up stages."""
    marks = {
        "server code imported": "sluice.transformer:",
        "workers starting": "starting ",
        "transformer ready": " ready: workers",
    }
    found: dict[str, float] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if stamp < after - 0.01:
            continue  # an earlier transformer of the same name
        for stage, needle in marks.items():
            if stage not in found and needle in line:
                found[stage] = stamp
    return found


class RecordWatch:
    """Notes when the ETL's record file first says phase Running (polls every 5 ms)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.running_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = None
        while not self._stop.is_set() and self.running_at is None:
            try:
                st = self.path.stat()
                sig = (st.st_ino, st.st_mtime_ns, st.st_size)
                if sig != last:
                    last = sig
                    if json.loads(self.path.read_text()).get("phase") == "Running":
                        self.running_at = time.time()
            except (OSError, ValueError):
                pass
            self._stop.wait(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def transformer_procs(pids: list[int]) -> list[psutil.Process]:
    """The transformer processes ``pids`` and their descendants (worker helper, workers)."""
    out: list[psutil.Process] = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out += [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
    return out


# -- one start ----------------------------------------------------------------


def one_start(
    client: Client, cluster: LocalCluster, case: str, name: str, shard_name: str
) -> dict[str, float]:
    state = cluster.data_dir / "etl"
    watch = RecordWatch(state / f"{name}.json")
    etl = client.etl(name)
    t0 = time.time()
    if case == "object":
        etl.init_code(transform=identity, wait=False)
    else:
        etl.init_code(transform=thumbnail, mode="wds", decode="pil", wait=False)
    t_put = time.time()
    etl.wait_until_running(timeout=300)
    t_sdk = time.time()
    bucket = client.bucket("bench")
    if case == "object":
        got = bucket.object("obj-0").get_bytes(etl_name=name)
        assert got == b"x" * 1024, "the identity ETL changed the object"
    else:
        got = bucket.object(shard_name).get_bytes(etl_name=name)
        with tarfile.open(fileobj=io.BytesIO(got)) as tar:
            members = tar.getnames()
        assert len(members) == 8, f"the wds ETL answered {members}"
    t_get = time.time()
    watch.stop()
    records = [json.loads(f.read_text()) for f in (state / "run").glob(f"etl-{name}-*.json")]
    cpu = cpu_seconds(transformer_procs([int(rec["pid"]) for rec in records]))

    times: dict[str, list[float]] = {}
    for rec in records:
        started = proc_start_wall(rec.get("startTime"))
        marks = log_times(Path(rec["log"]), t0)
        if started is not None:
            marks["process started"] = started
        for stage, at in marks.items():
            times.setdefault(stage, []).append(at)
    out = {stage: max(ats) - t0 for stage, ats in times.items()}  # the slowest target
    out["PUT answered"] = t_put - t0
    if watch.running_at is not None:
        out["record Running"] = watch.running_at - t0
    out["SDK returned"] = t_sdk - t0
    out["first GET answered"] = t_get - t0
    out["cpu"] = cpu
    etl.delete()
    return out


def settle(cluster_pid: int, quiet: float, limit: float = 30.0) -> None:
    """Wait until the cluster's processes are idle (< 5 % of a core over ``quiet`` s)."""
    deadline = time.monotonic() + limit
    me = psutil.Process(cluster_pid)
    while time.monotonic() < deadline:
        procs = [me, *me.children(recursive=True)]
        before = cpu_seconds(procs)
        time.sleep(quiet)
        if cpu_seconds(procs) - before < 0.05 * quiet:
            return


def zygote_line(cluster: LocalCluster, wait: float = 300.0) -> str:
    """The zygote's memory and its start-up line, or that there is none (waits for
    it to finish its imports: an ETL registered before would wait for it)."""
    zygotes = []
    for p in psutil.Process(cluster.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name() == "sluice-zygote":
                zygotes.append(p)
    if not zygotes:
        return "no zygote (SLUICE_ZYGOTE=off, or a Sluice without one)"
    log = cluster.data_dir / "etl" / "logs" / "zygote.log"
    deadline = time.monotonic() + wait
    ready: list[str] = []
    while not ready and time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        ready = [ln for ln in text.splitlines() if "ready in" in ln]
        time.sleep(0.2)
    mem = zygotes[0].memory_full_info()
    mib = 1 << 20
    return (
        f"zygote pid {zygotes[0].pid}: RSS {mem.rss / mib:.0f} MiB (USS {mem.uss / mib:.0f} MiB); "
        + (ready[-1] if ready else "not ready")
    )


def machine() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, load average {load}; Python {platform.python_version()}"


# --cold's two arms: the zygote on and off, or (--arms bytecode) the venv's .pyc
# files used and ignored (PYTHONPYCACHEPREFIX at an empty directory, nothing
# written: what a venv installed without them gives where PYTHONDONTWRITEBYTECODE
# is set, as on CI machines).
def arms(kind: str, scratch: Path) -> dict[str, dict[str, str]]:
    if kind == "bytecode":
        ignored = {"PYTHONPYCACHEPREFIX": str(scratch), "PYTHONDONTWRITEBYTECODE": "1"}
        return {".pyc used": {}, ".pyc ignored": ignored}
    return {f"SLUICE_ZYGOTE={m}": {"SLUICE_ZYGOTE": m} for m in ("eager", "off")}


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and every process under it, now."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
    return total


def cold_round(targets: int, env: dict[str, str], etls: int) -> list[float]:
    """``[ready, servers' CPU at ready, first ETL Running, next ...]`` in seconds,
    from a fresh data dir, with ``env`` set for ``sluice up`` and what it starts."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-etl-cold-") as tmp:
            t0 = time.perf_counter()
            with LocalCluster(Path(tmp) / "data", targets=targets) as cluster:
                out = [time.perf_counter() - t0, tree_cpu(cluster.pid)]
                client = Client(cluster.endpoint)
                for i in range(etls):
                    t = time.perf_counter()
                    client.etl(f"cold-{i}").init_code(transform=identity)
                    out.append(time.perf_counter() - t)
            return out
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cold_main(args: argparse.Namespace) -> None:
    print(f"etl_start --cold: {args.targets} targets, {args.rounds} rounds; {machine()}")
    with tempfile.TemporaryDirectory(prefix="sluice-no-pyc-") as scratch:
        modes = arms(args.arms, Path(scratch))
        rows: dict[str, list[list[float]]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode, env in modes.items():  # side by side: the same load for both
                got = cold_round(args.targets, env, 1 + args.next)
                rows[mode].append(got)
                print(f"  round {r} {mode}: " + " ".join(f"{x:.2f}" for x in got), flush=True)
    heads = ["sluice up ready", "servers' CPU at ready", "first ETL Running"] + [
        f"ETL {i + 2} Running" for i in range(args.next)
    ]
    print(f"\n{'median (max), s':22s}" + "".join(f"{m:>24s}" for m in modes))
    for i, head in enumerate(heads):
        cells = []
        for m in modes:
            vals = [row[i] for row in rows[m]]
            cells.append(f"{statistics.median(vals):.2f} ({max(vals):.2f})")
        print(f"{head:22s}" + "".join(f"{c:>24s}" for c in cells))
    print(f"after: {machine()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cold", action="store_true", help="a cold sluice up, then ETLs")
    parser.add_argument("--rounds", type=int, default=3, help="--cold: rounds")
    parser.add_argument("--next", type=int, default=2, help="--cold: ETLs after the first")
    parser.add_argument(
        "--arms", choices=("zygote", "bytecode"), default="zygote", help="--cold: what differs"
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--targets", type=int, default=3)
    parser.add_argument("--cases", default="object,wds")
    parser.add_argument("--settle", type=float, default=1.0, help="quiet seconds between starts")
    args = parser.parse_args()
    if args.cold:
        cold_main(args)
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if "wds" in cases:
        global torchvision
        import torchvision as tv

        torchvision = tv
    print(f"etl_start: {args.targets} targets, {args.reps} reps; {machine()}")
    with (
        tempfile.TemporaryDirectory(prefix="sluice-etl-start-") as tmp,
        LocalCluster(Path(tmp) / "data", targets=args.targets) as cluster,
    ):
        client = Client(cluster.endpoint)
        bucket = client.bucket("bench").create()
        bucket.object("obj-0").put_content(b"x" * 1024)
        shard_name = "shard-000.tar"
        bucket.object(shard_name).put_content(make_shard())
        settle(cluster.pid, args.settle)
        print(zygote_line(cluster), flush=True)
        results: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
        for rep in range(args.reps):
            for case in cases:
                settle(cluster.pid, args.settle)
                r = one_start(client, cluster, case, f"start-{case}-{rep}", shard_name)
                results[case].append(r)
                print(
                    f"  {case:6s} rep {rep}: Running {r['SDK returned']:.2f} s, "
                    f"first GET {r['first GET answered']:.2f} s, "
                    f"transformer CPU {r['cpu']:.2f} s",
                    flush=True,
                )
        print()
        for case in cases:
            rows = results[case]
            running = [r["SDK returned"] for r in rows]
            first = [r["first GET answered"] for r in rows]
            cpu = [r["cpu"] for r in rows]
            print(
                f"{case}: init_code -> Running median {statistics.median(running):.2f} s, "
                f"max {max(running):.2f} s; -> first GET median {statistics.median(first):.2f} s, "
                f"max {max(first):.2f} s; transformer CPU median {statistics.median(cpu):.2f} s"
            )
            for stage in STAGES:
                vals = [r[stage] for r in rows if stage in r]
                if vals:
                    print(f"    {stage:22s} {statistics.median(vals):6.2f} s")
        print(f"after: {machine()}")


if __name__ == "__main__":
    main()
