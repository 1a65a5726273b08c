"""The worker forker: workers forked by a helper report how they ended, and die with it.

The forker must start while its process has one thread, so each scenario runs
in a fresh interpreter (``python -c``), as the transformer's ``main()`` does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
