"""Progress bars: ``sluice put``/``get`` on a terminal, and the SDK's ``progress=True``.

The CLI runs as a subprocess whose stderr is a real pseudo-terminal (a person
watching), a pipe (a script), or a terminal with ``--quiet``; the servers are
a real gateway and target on loopback.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from etl_runtime import Client
from tests.cluster.conftest import MapCluster

SIZE = 3 << 20  # three 1 MiB chunks: the bar moves in steps


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with contextlib.ExitStack() as stack:
        cluster = MapCluster(tmp_path_factory.mktemp("progress"), stack)
        cluster.add_target("t0")
        url = cluster.start_gateway()
        stack.callback(cluster.close)
        with Client(url) as client:
            client.bucket("bars").create()
        yield url


def sluice(endpoint: str, *args: str, tty: bool) -> tuple[int, bytes, str]:
    """Run ``sluice``; (exit code, stdout, stderr) with stderr on a pty if ``tty``."""
    cmd = [sys.executable, "-m", "etl_runtime.cli", "--endpoint", endpoint, *args]
    env = dict(os.environ)
    env.pop("SLUICE_TOKEN", None)
    if not tty:
        done = subprocess.run(cmd, capture_output=True, timeout=120, env=env)
        return done.returncode, done.stdout, done.stderr.decode()
    master, replica = pty.openpty()
    # A terminal 100 columns wide, as a person's would be (a fresh pty says 0x0).
    fcntl.ioctl(replica, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=replica, env=env
    )
    os.close(replica)
    seen = bytearray()

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=120)  # stdout is drained while the bar is read
    code = proc.returncode
    reader.join(timeout=10)
    os.close(master)
    return code, out, seen.decode(errors="replace")


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("files") / "big.bin"
    path.write_bytes(os.urandom(SIZE))
    return path


def test_put_and_get_show_a_bar_on_a_terminal(endpoint: str, big_file: Path, tmp_path) -> None:
    code, _, err = sluice(endpoint, "put", str(big_file), "bars/big.bin", tty=True)
    assert code == 0, err
    assert "put bars/big.bin" in err and "100%" in err and "3.00M" in err, err

    out_file = tmp_path / "back.bin"
    code, _, err = sluice(endpoint, "get", "bars/big.bin", "-o", str(out_file), tty=True)
    assert code == 0, err
    assert "get bars/big.bin" in err and "100%" in err, err
    assert out_file.read_bytes() == big_file.read_bytes()


def test_no_bar_with_quiet_in_a_pipe_or_to_stdout(endpoint: str, big_file: Path) -> None:
    code, out, err = sluice(endpoint, "put", "-q", str(big_file), "bars/quiet.bin", tty=True)
    assert code == 0 and err.strip() == "", err
    assert b"put bars/quiet.bin (3145728 bytes" in out
    code, out, err = sluice(endpoint, "put", str(big_file), "bars/piped.bin", tty=False)
    assert code == 0 and err == "" and b"put bars/piped.bin" in out, err
    # The data goes to stdout: the terminal shows no bar, stdout holds only the data.
    code, out, err = sluice(endpoint, "get", "bars/big.bin", tty=True)
    assert code == 0 and err.strip() == "", err
    assert out == big_file.read_bytes()


def test_sdk_shows_a_bar_only_when_asked(
    endpoint: str, big_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(endpoint) as client:
        obj = client.bucket("bars").object("sdk.bin")
        obj.put_file(big_file)
        assert obj.get_bytes() == big_file.read_bytes()
        assert capsys.readouterr().err == ""

        obj.put_file(big_file, progress=True)
        err = capsys.readouterr().err
        assert "put bars/sdk.bin" in err and "100%" in err, err
        assert obj.get_bytes(progress=True) == big_file.read_bytes()
        err = capsys.readouterr().err
        assert "get bars/sdk.bin" in err and "100%" in err, err
        with obj.open(progress=True) as reader:
            buf = io.BytesIO(reader.read(1 << 20))
        assert len(buf.getvalue()) == 1 << 20
        assert "get bars/sdk.bin" in capsys.readouterr().err
