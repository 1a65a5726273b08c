"""AIStore-style ETL images under podman: a local cluster's transformer for ``init(image=...)``.

An ETL whose ``spec.commType`` is ``hpush://`` has the user's image as its
transformer (``etl/aisimage.py``). ``sluice up`` runs one container of it per
target, as it runs one ``etl_runtime.webserver`` process for other ETLs, and
through the same machinery (``processes.spawn``: a log file, a pid file, the
launcher that stops it with its parent, readiness by ``GET /health``):

    podman run --rm --replace --name sluice-<etl>-<target>-<spec hash>
      --runtime runc --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 [--init]
      -p 127.0.0.1:<free port>:8000 --label sluice.dev/etl=<etl> --label sluice.dev/state=<id>
      --env AIS_TARGET_URL --env DIRECT_PUT --env <each spec.env name> IMAGE [spec.command...]

* reachable only from this machine: the image's port 8000 (AIStore's default)
  is published on 127.0.0.1 alone; the target PUTs the object's bytes to it;
* environment as AIStore gives its ETL pods: ``AIS_TARGET_URL`` (the target's
  URL), ``DIRECT_PUT=false`` and the init message's env; values travel in
  podman's own environment (``--env NAME``), not on its command line (but for
  names podman itself reads, such as ``PATH``);
* ``--runtime runc`` when runc is installed (crun cannot start containers on
  some cgroup layouts), ulimits a rootless or containerised podman can grant,
  ``--init`` (catatonit, when present) so the image's server, PID 1, stops on
  SIGTERM; ``SLUICE_PODMAN_ARGS`` adds arguments (e.g. ``--pull=never``);
* stopping a transformer removes its container (``podman rm -f``) before the
  ``podman run`` process is stopped; deleting an ETL, and starting or stopping
  the controller, remove whatever containers of it (by label) are left.

Without podman (``SLUICE_PODMAN=off`` too) such an ETL is refused at init with a
400 naming the ETL, the image and what is missing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shlex
import shutil
import sys
from pathlib import Path

from etl_runtime.cluster.records import EtlRecord, TargetInfo
from etl_runtime.core.errors import InvalidSpec
from etl_runtime.core.spec import EtlSpec
from etl_runtime.local import processes
from etl_runtime.local.processes import TransformerProcess

log = logging.getLogger(__name__)

PODMAN_ENV = "SLUICE_PODMAN"  # the podman to use, or "off"
ARGS_ENV = "SLUICE_PODMAN_ARGS"
PORT = 8000  # AIStore's DefaultContainerPort
ETL_LABEL = "sluice.dev/etl"
STATE_LABEL = "sluice.dev/state"
CATATONIT = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit", "/usr/local/bin/catatonit")
REMOVE_SECONDS = 60.0


def podman() -> str | None:
    """The podman binary, or None (not installed, or ``SLUICE_PODMAN=off``)."""
    value = os.environ.get(PODMAN_ENV, "").strip()
    if value.lower() in ("off", "no", "none", "0"):
        return None
    return shutil.which(value or "podman")


def check(name: str, spec: EtlSpec) -> None:
    """``InvalidSpec`` (400) when this machine cannot run the ETL's image."""
    if not spec.foreign or podman() is not None:
        return
    given = os.environ.get(PODMAN_ENV, "").strip()
    why = (
        f"{PODMAN_ENV}={given}"
        if given.lower() in ("off", "no", "none", "0")
        else f"there is no {given!r} on this machine"
        if given
        else "podman is not installed on this machine"
    )
    raise InvalidSpec(
        f"ETL {name!r} is the container image {spec.image!r} (an AIStore-style ETL "
        f"image, commType {spec.comm_type}): a local cluster (sluice up) runs such images "
        f"with podman, and {why}. Install podman (apt-get install podman runc), run it on "
        "Kubernetes, or give the code to Sluice's runtime (init_class, or Sluice's spec "
        "with code.source)",
        etl=name,
    )


def state_id(state_dir: Path) -> str:
    return hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:12]


def container_name(transformer: str, spec_hash: str) -> str:
    return f"sluice-{transformer}-{spec_hash[:8]}"


def container_env(spec: EtlSpec, target: TargetInfo) -> dict[str, str]:
    """What AIStore sets in an ETL pod (``ext/etl/boot.go``), then the init message's env."""
    return {"AIS_TARGET_URL": target.url, "DIRECT_PUT": "false"} | dict(spec.env)


def run_argv(
    binary: str, name: str, rec: EtlRecord, env: dict[str, str], state_dir: Path, port: int
) -> list[str]:
    spec = rec.spec
    argv = [binary, "run", "--rm", "--replace", "--name", name]
    if shutil.which("runc"):
        argv += ["--runtime", "runc"]
    argv += ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
    if any(os.path.exists(p) for p in CATATONIT):
        argv.append("--init")
    argv += ["-p", f"127.0.0.1:{port}:{PORT}"]
    argv += ["--label", f"{ETL_LABEL}={rec.name}"]
    argv += ["--label", f"{STATE_LABEL}={state_id(state_dir)}"]
    argv += shlex.split(os.environ.get(ARGS_ENV, ""))
    for key, value in env.items():
        # podman's own variables (PATH, HOME, ...) stay podman's: those go inline
        argv += ["--env", f"{key}={value}" if key in os.environ else key]
    assert spec.image is not None
    return [*argv, spec.image, *spec.command]


async def spawn(
    rec: EtlRecord, target: TargetInfo, name: str, restarts: int, state_dir: Path
) -> TransformerProcess:
    """Start the container of ``rec`` beside ``target`` (``processes.spawn`` runs podman)."""
    binary = podman()
    want = rec.spec.content_hash()
    cname = container_name(name, want)
    env = container_env(rec.spec, target)
    # podman itself needs PATH, HOME, XDG_* ...; the container gets only the --env names.
    # Not adoptable: if the gateway dies, podman gets SIGTERM and the container stops.
    podman_env = processes.transformer_env(dict(os.environ), (), env)
    podman_env.update({k: v for k, v in os.environ.items() if k in env})

    def argv(port: int) -> list[str]:
        if binary is None:  # gone since init: a config error (exit 2) that says why
            why = "sluice: podman is missing"
            try:
                check(rec.name, rec.spec)
            except InvalidSpec as e:
                why = f"sluice: {e.message}"
            return [sys.executable, "-c", f"import sys; print({why!r}); sys.exit(2)"]
        return run_argv(binary, cname, rec, env, state_dir, port)

    return await processes.spawn(
        etl=rec.name,
        target=target.id,
        name=name,
        spec_hash=want,
        env=podman_env,
        state_dir=state_dir,
        restarts=restarts,
        container=argv,
    )


def is_container(p: TransformerProcess) -> str | None:
    """The container name ``p`` (a ``podman run``) serves, from its command line."""
    try:
        argv = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if not argv or not argv[0].endswith(b"podman") or b"--name" not in argv:
        return None
    return argv[argv.index(b"--name") + 1].decode()


async def _podman(*args: str) -> tuple[int, str]:
    binary = podman()
    if binary is None:
        return 0, ""
    proc = await asyncio.create_subprocess_exec(
        binary,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(REMOVE_SECONDS):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"podman {' '.join(args)} did not finish in {REMOVE_SECONDS:g}s"
    return proc.returncode or 0, out.decode(errors="replace").strip()


async def remove(*names: str) -> None:
    """``podman rm -f`` (the server gets SIGTERM, then SIGKILL after 2 s)."""
    if names:
        code, out = await _podman("rm", "--force", "--ignore", "--time", "2", *names)
        if code:
            log.warning("removing containers %s: %s", ", ".join(names), out)


async def remove_labelled(state_dir: Path, etl: str | None = None) -> None:
    """Remove this local cluster's containers (of one ETL, or all) that are left."""
    filters = ["--filter", f"label={STATE_LABEL}={state_id(state_dir)}"]
    if etl is not None:
        filters += ["--filter", f"label={ETL_LABEL}={etl}"]
    code, out = await _podman("ps", "--all", "--quiet", *filters)
    if code == 0 and out:
        await remove(*out.split())
