"""The worker forker: workers forked by a helper report how they ended, and die with it.

The forker must start while its process has one thread, so each scenario runs
in a fresh interpreter (``python -c``), as the transformer's ``main()`` does.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import time

import httpx
import psutil

from tests.webserver.conftest import AUTH, source_code, transformer

SCENARIO = textwrap.dedent(
    """
    import os, signal, socket, sys, time
    from etl_runtime.webserver.forker import Forker

    def echo_then_exit(sock, code):
        data = sock.recv(100)
        sock.sendall(data.upper() + b" " + str(os.getppid()).encode())
        if code == "hang":
            time.sleep(600)
        os._exit(int(code))

    forker = Forker(preload=["json"])
    forker.start()
    procs = []
    for code in ("3", "hang"):
        ours, theirs = socket.socketpair()
        p = forker.process(echo_then_exit, (theirs, code))
        p.start()
        theirs.close()
        ours.sendall(b"hi")
        text, ppid = ours.recv(100).decode().split()
        print(text, int(ppid) == forker.pid, flush=True)
        procs.append((p, ours))
    done, done_sock = procs[0]
    done.join(30)
    print("exit", done.exitcode, done.is_alive(), flush=True)
    hung, _ = procs[1]
    hung.kill()
    hung.join(30)
    print("killed", hung.exitcode, flush=True)
    helper = forker.pid
    forker.close()
    try:
        os.kill(forker.pid or helper, 0)
        print("helper alive", flush=True)
    except ProcessLookupError:
        print("helper gone", flush=True)
    """
)


def test_workers_report_exit_codes_and_the_helper_exits_with_its_server() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    # Each worker ran the target with its socket; its parent is the helper, not us.
    assert out.stdout.splitlines() == [
        "HI True",
        "HI True",
        "exit 3 False",
        f"killed {-9}",
        "helper gone",
    ], out.stdout + out.stderr


UPPER = "def transform(data):\n    return data.upper()\n"


def _by_name(parent: psutil.Process, name: str) -> list[psutil.Process]:
    out = []
    for p in parent.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name() == name and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def test_a_dead_forker_is_replaced_and_workers_keep_being_replaced() -> None:
    """The helper that forks workers is killed (say, by the OOM killer), then a worker
    dies: the transformer starts a new helper for the replacement and keeps serving,
    instead of failing every later worker start."""
    spec = {"mode": "object", "code": source_code(UPPER)}
    with transformer("upper", spec, workers=2, SLUICE_INLINE="0") as url:
        server = next(
            p
            for p in psutil.process_iter(["cmdline"])
            if url.rsplit(":", 1)[1] in " ".join(p.info["cmdline"] or ())
            and "etl_runtime.webserver" in " ".join(p.info["cmdline"] or ())
        )
        (helper,) = _by_name(server, "sluice-forker")
        victim = _by_name(server, "sluice-worker")[0]  # the helper's children
        helper.kill()
        deadline = time.monotonic() + 30
        while _by_name(server, "sluice-forker") and time.monotonic() < deadline:
            time.sleep(0.05)  # a zombie until the server reaps it: not counted
        victim.kill()
        # A request sent in the instant before the server sees the death may go to the
        # dead worker (a WorkerDied answer, as for a worker dying mid-transform): what
        # this test asks is that the replacement comes, from a new helper.
        # (The helper's children left the server's tree with it: a worker in it is new.)
        deadline = time.monotonic() + 30
        while not _by_name(server, "sluice-worker") and time.monotonic() < deadline:
            time.sleep(0.05)
        for i in range(20):  # two workers again, through a new helper; none fails
            r = httpx.put(f"{url}/b/o{i}", content=b"abc", headers=AUTH, timeout=60)
            assert r.status_code == 200, r.text
            assert r.content == b"ABC"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            helpers, workers = _by_name(server, "sluice-forker"), _by_name(server, "sluice-worker")
            if len(helpers) == 1 and workers:  # the survivor is no child of ours now
                break
            time.sleep(0.2)
        assert len(helpers) == 1 and helpers[0].pid != helper.pid, helpers
        assert any(w.ppid() == helpers[0].pid for w in workers), "no worker of the new helper"
        assert server.is_running() and server.status() != psutil.STATUS_ZOMBIE
