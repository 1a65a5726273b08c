"""``sluice`` as a user runs it: a subprocess against a real local cluster."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.servers import free_port


def sluice(endpoint: str, *args: str, input: bytes | None = None, env: dict | None = None):
    cmd = [sys.executable, "-m", "etl_runtime.cli", "--endpoint", endpoint, *args]
    full_env = {**os.environ, "SLUICE_TOKEN": "", **(env or {})}
    return subprocess.run(cmd, input=input, capture_output=True, timeout=180, env=full_env)


def ok(endpoint: str, *args: str, **kw) -> str:
    r = sluice(endpoint, *args, **kw)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode()


def fails(endpoint: str, *args: str) -> str:
    """Run, expect exit 1 with exactly one `sluice: error:` line and no traceback."""
    r = sluice(endpoint, *args)
    err = r.stderr.decode()
    assert r.returncode == 1, (r.returncode, err)
    assert err.startswith("sluice: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_buckets_and_objects(endpoint: str, tmp_path: Path) -> None:
    assert "ready" in ok(endpoint, "bucket", "create", "cli-b")
    assert "cli-b" in ok(endpoint, "bucket", "ls").split()
    payload = bytes(range(256)) * 4 + b"\r\n\x00"
    src = tmp_path / "in.bin"
    src.write_bytes(payload)
    assert "put cli-b/dir/in.bin" in ok(endpoint, "put", str(src), "cli-b/dir/in.bin")
    ok(endpoint, "put", "-", "cli-b/stdin.txt", input=b"from stdin")

    listing = ok(endpoint, "ls", "cli-b")
    assert "dir/in.bin" in listing and "stdin.txt" in listing and str(len(payload)) in listing
    assert "stdin.txt" not in ok(endpoint, "ls", "cli-b", "--prefix", "dir/")

    # stdout is binary-safe; -o writes a file.
    assert sluice(endpoint, "get", "cli-b/dir/in.bin").stdout == payload
    out = tmp_path / "out.bin"
    ok(endpoint, "get", "cli-b/dir/in.bin", "-o", str(out))
    assert out.read_bytes() == payload

    assert "deleted" in ok(endpoint, "bucket", "rm", "cli-b")
    assert "cli-b" not in ok(endpoint, "bucket", "ls").split()


def test_errors_are_one_line_naming_the_thing(endpoint: str, tmp_path: Path) -> None:
    ok(endpoint, "bucket", "create", "cli-err")
    assert "missing.txt" in fails(endpoint, "get", "cli-err/missing.txt")
    assert "nope-bucket" in fails(endpoint, "ls", "nope-bucket")
    assert "no-such-etl" in fails(endpoint, "etl", "show", "no-such-etl")
    assert "BUCKET/OBJECT" in fails(endpoint, "get", "just-a-bucket")
    assert "no such file" in fails(endpoint, "put", str(tmp_path / "nope"), "cli-err/x")
    code = tmp_path / "t.py"
    code.write_text("def other(data):\n    return data\n")
    assert "'transform'" in fails(endpoint, "etl", "init", "x", "--code", f"{code}:transform")
    dead = f"http://127.0.0.1:{free_port()}"
    assert "127.0.0.1" in fails(dead, "bucket", "ls")
    out = tmp_path / "never.bin"
    fails(endpoint, "get", "cli-err/missing.txt", "-o", str(out))
    assert not out.exists() and not list(tmp_path.glob(".never.bin*"))


def test_etl_lifecycle(endpoint: str, tmp_path: Path) -> None:
    ok(endpoint, "bucket", "create", "cli-etl")
    ok(endpoint, "put", "-", "cli-etl/a.txt", input=b"abc")
    code = tmp_path / "rev.py"
    code.write_text(
        "import json\n\n"
        "def reverse(data, args):\n"
        "    n = json.loads(args)['n'] if args else 1\n"
        "    return data[::-1] * n\n"
    )
    assert "Running (3/3 ready)" in ok(
        endpoint, "etl", "init", "cli-rev", "--code", f"{code}:reverse", "--on-error", "skip"
    )
    assert ok(endpoint, "get", "cli-etl/a.txt", "--etl", "cli-rev") == "cba"
    assert ok(endpoint, "get", "cli-etl/a.txt", "--etl", "cli-rev", "--etl-args", '{"n":2}') == (
        "cbacba"
    )

    assert re.search(r"cli-rev\s+Running\s+object\s+3/3", ok(endpoint, "etl", "ls"))
    show = ok(endpoint, "etl", "show", "cli-rev")
    assert "phase:    Running" in show and "ready:    3/3" in show
    assert len(re.findall(r"http://127\.0\.0\.1:\d+\s+ready", show)) == 3
    assert re.search(r"counts:\s+objects [1-9]", show)
    assert "==>" in ok(endpoint, "etl", "logs", "cli-rev")

    assert "Stopped" in ok(endpoint, "etl", "stop", "cli-rev")
    assert "cli-rev" in fails(endpoint, "get", "cli-etl/a.txt", "--etl", "cli-rev")
    ok(endpoint, "etl", "start", "cli-rev")
    deadline = time.monotonic() + 120
    while sluice(endpoint, "get", "cli-etl/a.txt", "--etl", "cli-rev").stdout != b"cba":
        assert time.monotonic() < deadline, "ETL did not come back after start"
        time.sleep(0.5)
    assert "deleted" in ok(endpoint, "etl", "rm", "cli-rev")
    assert "cli-rev" in fails(endpoint, "etl", "rm", "cli-rev")


def test_token_from_flag_and_env(tmp_path: Path) -> None:
    from tests.e2e.local import running_cluster

    with running_cluster(tmp_path / "c", targets=1, token="cli-tok") as ep:
        fails(ep, "bucket", "create", "locked")  # 401: one line, exit 1
        assert "locked" not in ok(ep, "bucket", "ls").split()
        ok(ep, "--token", "cli-tok", "bucket", "create", "locked")
        ok(ep, "put", "-", "locked/x", input=b"x", env={"SLUICE_TOKEN": "cli-tok"})
        assert ok(ep, "get", "locked/x") == "x"


def test_sluice_up_runs_a_cluster_until_interrupted(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "etl_runtime.cli",
            "up",
            "--targets",
            "2",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "up"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).json()
                if health.get("targets") == 2:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        endpoint = f"http://127.0.0.1:{port}"
        ok(endpoint, "bucket", "create", "up-b")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert b"Sluice is up: http://127.0.0.1:" in (proc.stdout.read() if proc.stdout else b"")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
