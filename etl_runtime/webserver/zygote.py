"""``python -m etl_runtime.webserver --zygote-fd N``: a pre-started transformer runtime.

A transformer started from scratch spends most of its start-up importing:
the interpreter, FastAPI and uvicorn (about a second of CPU), then in wds mode
webdataset's codecs, then the user's own imports (torchvision: several
seconds more) in every worker. On a laptop running three targets, three such
starts at once compete for the same cores. The local cluster's ETL controller
therefore keeps one *zygote*: a process that has imported the transformer's
modules and the usual heavy libraries once (``PRELOAD``, plus
``SLUICE_ZYGOTE_PRELOAD``; those not installed are skipped), then, per new
transformer, forks a child that becomes ``python -m etl_runtime.webserver``
would have: its own session, its log file as stdout and stderr, the working
directory, environment and arguments it was asked for, ``PR_SET_PDEATHSIG``
towards the zygote (``--adoptable`` semantics when asked, see ``core.procs``).
The child then runs the transformer's ``main()``; its worker helper
(``forker``) and workers are forks of it, so nothing is imported twice. The
user's code is still loaded in each worker, after the fork.

``SLUICE_ZYGOTE_STAGE=lite`` (set by the controller for its first zygote)
preloads only the server's own modules (``LITE``: about a second of CPU, not
the ten of torch and torchvision) and names itself ``sluice-zyg-lite``: it is
ready by the time ``sluice up`` is, so the first ETL never waits for torch; a
child of it that needs torch imports it itself, as a fresh start would.

The zygote is single-threaded when it forks (nothing it imports starts a
thread but OpenBLAS's pool, which handles ``fork`` itself); it never runs a
torch operation, so a child's first torch call initializes torch's threads in
the child (see ``tests/webserver/test_zygote.py``).

Protocol, JSON lines on the inherited socket ``--fd``: the zygote first says
``{"ready": true, "pid": P, "preloaded": [...], "seconds": S}``; a request
``{"id": I, "argv": [...], "env": {...}, "cwd": D, "log": PATH, "adoptable": B}``
(with ``"user": {"uid", "gid", "groups"}`` the child drops to that uid first) is
answered ``{"id": I, "pid": CHILD}`` (or ``{"id": I, "error": TEXT}``), and
``{"exit": CHILD, "code": C}`` follows when the zygote reaps that child
(negative: the signal that killed it). When the other end closes, the zygote
exits; its children are told by their death signal (``core.procs``).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any

from etl_runtime.core import procs
from etl_runtime.wire.http import names as uvicorn_names

PRELOAD_ENV = "SLUICE_ZYGOTE_PRELOAD"
STAGE_ENV = "SLUICE_ZYGOTE_STAGE"  # "lite": the server's modules only
# What every transformer imports (server, worker, the wds path and its torch) and
# what user code usually does; modules that are not installed are skipped.
PRELOAD = (
    "etl_runtime.webserver.__main__",
    "etl_runtime.webserver.worker",
    "uvloop",
    "httptools",
    *uvicorn_names.PRELOAD,  # uvicorn's modules (wire/http/names.py)
    "numpy",
    "PIL.Image",
    "etl_runtime.webserver.samples",  # webdataset's codecs (torch: torchvision's, next)
    "torchvision",
)
LITE = PRELOAD[: PRELOAD.index("numpy")]  # what every transformer's server imports


def is_lite(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(STAGE_ENV, "") == "lite"


def preload_modules(environ: Mapping[str, str] = os.environ) -> list[str]:
    if is_lite(environ):
        return list(LITE)
    extra = [m.strip() for m in environ.get(PRELOAD_ENV, "").split(",") if m.strip()]
    return list(dict.fromkeys([*PRELOAD, *extra]))


def preload(names: list[str]) -> list[str]:
    """Import ``names`` (skipping what is not installed or fails); those imported."""
    done = []
    for name in names:
        try:
            if importlib.util.find_spec(name.split(".")[0]) is None:
                continue
            importlib.import_module(name)
        except Exception as e:  # a broken optional library must not stop the zygote
            print(f"sluice zygote: not preloading {name}: {type(e).__name__}: {e}", flush=True)
            continue
        done.append(name)
    return done


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(json.dumps(msg).encode() + b"\n")


def _child(req: dict[str, Any], zygote: int) -> int:
    """In the forked child: become the transformer the request describes."""
    os.setsid()
    fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    os.chdir(req["cwd"])
    if (user := req.get("user")) is not None:  # an ETL's own uid (local/runas.py)
        os.setgroups([int(g) for g in user["groups"]])
        os.setgid(int(user["gid"]))
        os.setuid(int(user["uid"]))
        with contextlib.suppress(OSError, AttributeError):  # PR_SET_DUMPABLE, as exec does
            ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0)
    os.environ.clear()
    os.environ.update(req["env"])
    argv = [str(a) for a in req["argv"]]
    sys.argv = ["sluice-transformer", *argv]
    procs.die_with_parent(
        zygote, procs.ADOPTABLE_SIGNAL if req.get("adoptable") else signal.SIGTERM
    )
    from etl_runtime.webserver.__main__ import main

    return main(argv)


def serve(control: socket.socket, names: list[str]) -> None:
    started = time.monotonic()
    preloaded = preload(names)
    gc.collect()
    gc.freeze()  # what the preload made is never collected: fewer pages copied per child
    seconds = round(time.monotonic() - started, 3)
    print(f"sluice zygote: ready in {seconds}s: {', '.join(preloaded)}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    me = os.getpid()
    _send(
        control,
        {
            "ready": True,
            "pid": me,
            "preloaded": preloaded,
            "seconds": seconds,
        },
    )
    poller = select.poll()
    poller.register(control.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    buf = b""
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for fd, _ev in events:
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                continue
            try:
                data = control.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                return  # the controller is gone
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                _fork(control, json.loads(line), me, (wake_r, wake_w))
        _reap(control)


def _fork(control: socket.socket, req: dict[str, Any], me: int, wake: tuple[int, int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as e:
        _send(control, {"id": req.get("id"), "error": f"fork failed: {e}"})
        return
    if pid:
        _send(control, {"id": req.get("id"), "pid": pid})
        return
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        for end in wake:
            os.close(end)
        control.close()
        code = _child(req, me)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(control, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def main(fd: int) -> int:
    """Serve the controller on socket ``fd``. Started as ``python -m etl_runtime.webserver
    --zygote-fd N``: its children then show in ``ps`` as transformers."""
    control = socket.socket(fileno=fd)
    procs.set_process_name("sluice-zyg-lite" if is_lite() else "sluice-zygote")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller stops us (or its death does)
    serve(control, preload_modules())
    return 0
