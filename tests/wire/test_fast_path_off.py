"""A uvicorn without a hook: the fast path turns itself off, and the metric and one line say so.

The target runs in its own process with ``HttpToolsProtocol._start_asgi_task``
hidden from the class, as in a uvicorn released before the hook (0.44) or after
it is renamed: uvicorn's own calls still work, ``zerocopy`` and ``inprotocol``
see no hook and stay out of the way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import uvicorn

from etl_runtime.wire.http import hooks
from tests.servers import free_port, wait_http

BIG = bytes(range(256)) * 4096  # 1 MiB: a sendfile answer when the hook is there

HIDE_HOOK = """
import runpy, sys
from uvicorn.protocols.http import httptools_impl

start = httptools_impl.HttpToolsProtocol._start_asgi_task

class InstanceOnly:  # what uvicorn's own calls see; the class itself has no such attribute
    def __get__(self, obj, owner=None):
        if obj is None:
            raise AttributeError("_start_asgi_task")
        return start.__get__(obj, owner)

httptools_impl.HttpToolsProtocol._start_asgi_task = InstanceOnly()
sys.argv = ["sluice-target", *sys.argv[1:]]
runpy.run_module("etl_runtime.storage_target", run_name="__main__")
"""


def _gauges(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    found = re.findall(r'^sluice_fast_path_enabled\{path="(\w+)"\} (\S+)$', text, re.M)
    return {path: float(value) for path, value in found}


def test_every_fast_path_is_on_with_the_tested_uvicorn() -> None:
    assert hooks.off_reasons({}) == dict.fromkeys(hooks.PATHS)


def test_a_missing_hook_turns_zerocopy_off_and_says_so(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "target.log"
    env = {"SLUICE_HOST": "127.0.0.1", "SLUICE_PORT": str(port)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", HIDE_HOOK, "--data-dir", str(tmp_path / "data")],
            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_http(f"{url}/v1/health", timeout=60, proc=proc)
        with httpx.Client(base_url=url) as c:
            c.post("/v1/buckets/bkt", json={"action": "create-bck"}).raise_for_status()
            c.put("/v1/objects/bkt/o", content=BIG).raise_for_status()
            assert c.get("/v1/objects/bkt/o").content == BIG  # still served, by copying
            gauges = _gauges(c)
            sent = re.search(
                r"^sluice_sendfile_bytes_total\S* (\S+)$", c.get("/metrics").text, re.M
            )
        assert gauges == {"zerocopy": 0, "inprotocol": 0, "wholebody": 1, "splice": 1}
        assert sent is not None and float(sent.group(1)) == 0  # nothing went by sendfile
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [ln for ln in log_path.read_text().splitlines() if "fast paths off" in ln]
    missing = f"uvicorn {uvicorn.__version__}: HttpToolsProtocol has no _start_asgi_task"
    assert len(lines) == 1, log_path.read_text()[-3000:]
    assert f"zerocopy ({missing})" in lines[0] and f"inprotocol ({missing})" in lines[0]
    assert "wholebody" not in lines[0] and "splice" not in lines[0]
