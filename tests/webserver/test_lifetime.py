"""A transformer killed outright takes its worker processes with it.

Workers ignore SIGTERM/SIGINT (the server decides when they stop by closing
their socket), so a SIGKILLed transformer could leave workers running user
code forever -- here, code stuck while loading.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.servers import free_port
from tests.webserver.conftest import source_code, transformer_env

STUCK = "import time\ntime.sleep(3600)\n\ndef transform(data):\n    return data\n"


def test_sigkilled_transformer_leaves_no_workers() -> None:
    spec = {"mode": "object", "code": source_code(STUCK)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "etl_runtime.webserver", "--host", "127.0.0.1"]
        + ["--port", str(free_port()), "--workers", "2"],
        env={**os.environ, **transformer_env("stuck", spec, SLUICE_INLINE="0")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 60
        workers: list[psutil.Process] = []
        while time.monotonic() < deadline:  # forker helper + 2 workers, all loading the code
            workers = parent.children(recursive=True)
            if len(workers) >= 3:
                break
            time.sleep(0.1)
        assert len(workers) >= 3, f"workers never started: {workers}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, f"orphaned after SIGKILL of the transformer: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
