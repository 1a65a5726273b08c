"""A transformer that exits while its health probe is out keeps the reason it exited.

The local controller probes starting transformers while other code polls their
exit. A probe that failed *because* the process had just exited used to set
the message back to "starting", so an ETL in phase Error showed "starting"
instead of the user's error (seen in CI: ``test_bad_code_is_error_without_crash_loop``).
Real parts: a child process that exits with the config-error code and a line
on its log, and a loopback socket that holds the probe until the child is gone.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import httpx

from etl_runtime.cluster.reconcile import EXIT_CONFIG_ERROR
from etl_runtime.local.processes import TransformerProcess

MESSAGE = "sluice: ETL 'bad' failed: boom"


def test_an_exit_during_a_probe_keeps_its_message(tmp_path: Path) -> None:
    async def scenario() -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        log_path = tmp_path / "t.log"
        with open(log_path, "wb") as log:
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                f"print({MESSAGE!r}); raise SystemExit({EXIT_CONFIG_ERROR})",
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )
        p = TransformerProcess(
            etl="bad", target="t0", name="etl-bad-t0", spec_hash="h", port=port,
            pid=child.pid, log_path=log_path, popen=child,
        )  # fmt: skip
        assert not p.poll() or p.terminated
        async with httpx.AsyncClient(timeout=30) as client:
            probe = asyncio.create_task(p.probe(client, 3))
            conn, _ = await asyncio.get_running_loop().sock_accept(listener)  # the probe is out
            await child.wait()
            assert p.poll()  # the exit is seen while the probe waits
            assert p.message == MESSAGE
            conn.close()  # the probe fails now
            await probe
        listener.close()
        assert p.terminated and p.exit_code == EXIT_CONFIG_ERROR
        assert p.message == MESSAGE, p.message

    asyncio.run(scenario())
