"""The package as a user installs it: a wheel built from the checkout, in a clean venv.

``pip install sluice`` is the SDK, the CLI and the PyTorch datasets; the servers
are ``sluice[server]``. Each venv gets the locked versions (``uv export`` of
``uv.lock`` as constraints), offline from uv's cache (what ``make install``
filled; a version missing there is fetched), and runs from a temporary
directory, so nothing of the checkout is on its path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UV = Path(os.environ.get("SLUICE_UV", Path.home() / ".cache/sluice/tools/bin/uv"))
SERVER_LIBS = ("fastapi", "starlette", "uvicorn", "httptools", "kopf", "kubernetes", "obstore")


def _uv(*args: str | Path, cwd: Path) -> str:
    uv = str(UV) if UV.exists() else shutil.which("uv") or "uv"
    argv = [uv, *map(str, args)]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=240)
    if done.returncode and "--offline" in argv:  # a locked version uv's cache lacks: fetch it
        argv.remove("--offline")
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"uv {' '.join(map(str, args))}:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the wheel, the lock's versions as a constraints file)."""
    out = tmp_path_factory.mktemp("dist")
    # sdist, then the wheel from it: the build never writes build/ into the checkout
    _uv("build", "--offline", "--quiet", "--out-dir", out, REPO, cwd=out)
    (wheel,) = out.glob("sluice-*.whl")
    constraints = out / "constraints.txt"
    _uv(
        "export", "--frozen", "--no-hashes", "--no-emit-project", "--all-extras",
        "--format", "requirements-txt", "--project", REPO, "-o", constraints, cwd=out,
    )  # fmt: skip
    yield wheel, constraints


def _venv(where: Path, wheel: Path, constraints: Path, extra: str = "") -> Path:
    _uv("venv", "--quiet", "--python", sys.executable, where / "venv", cwd=where)
    python = where / "venv" / "bin" / "python"
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    _uv("pip", "install", "--quiet", "--offline", "--python", python, "-c", constraints, spec,
        cwd=where)  # fmt: skip
    return python


def _clean_env(venv_python: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv_python.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


SDK_ONLY = """
import sys
import etl_runtime.sdk, etl_runtime.cli, etl_runtime.pytorch
from etl_runtime import Client
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))
print("loaded:", ",".join(loaded) or "-")
print("from:", etl_runtime.sdk.__file__)
"""


def test_the_sdk_alone_installs_and_imports_without_the_server_stack(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    python = _venv(tmp_path, *built)
    env = _clean_env(python)
    done = subprocess.run(
        [python, "-c", SDK_ONLY, *SERVER_LIBS],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "loaded: -\n" in done.stdout, done.stdout
    assert str(tmp_path / "venv") in done.stdout  # the installed package, not the checkout
    for lib in SERVER_LIBS:  # `pip install sluice` brings none of them
        probe = subprocess.run(
            [python, "-c", f"import {lib}"], cwd=tmp_path, env=env, capture_output=True
        )
        assert probe.returncode != 0, f"{lib} is installed with the SDK alone"
    up = subprocess.run(
        [python.parent / "sluice", "up", "--data-dir", tmp_path / "data"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert up.returncode == 1
    assert "pip install 'sluice[server]'" in up.stderr, up.stderr
    assert "Traceback" not in up.stderr


CLIENT = """
import sys
import httpx
from etl_runtime import Client

def shout(data: bytes) -> bytes:
    return data.upper()

url = sys.argv[1]
with Client(url) as client:
    bucket = client.bucket("pkg").create()
    bucket.object("a.txt").put_content(b"hello from a wheel")
    print("get:", bucket.object("a.txt").get_bytes().decode())
    client.etl("shout").init_code(transform=shout, timeout=120)
    print("etl:", bucket.object("a.txt").get_bytes(etl_name="shout").decode())
ui = httpx.get(url + "/ui", timeout=30)
print("ui:", ui.status_code, ui.headers["content-type"], "<html" in ui.text.lower())
"""


def test_a_wheel_with_the_server_extra_runs_sluice_up(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    python = _venv(tmp_path, *built, extra="server")
    env = _clean_env(python)
    up = subprocess.Popen(
        [python.parent / "sluice", "up", "--targets", "1", "--port", "0",
         "--data-dir", tmp_path / "data"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        url = None
        for line in up.stdout:
            found = re.search(r"Sluice is up: (\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, f"sluice up never came up: {up.stderr.read() if up.stderr else ''}"
        done = subprocess.run(
            [python, "-c", CLIENT, url],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "get: hello from a wheel\n" in done.stdout
        assert "etl: HELLO FROM A WHEEL\n" in done.stdout
        assert "ui: 200 text/html" in done.stdout and done.stdout.rstrip().endswith("True")
    finally:
        up.terminate()
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
