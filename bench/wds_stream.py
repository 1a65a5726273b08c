"""Time to first byte and transformer peak RSS for ~50 MB and ~500 MB shards.

Shards are generated on the fly (never held in memory) and uploaded chunked by
a full-duplex h11 client: one thread sends the shard while the main thread
reads the transformed shard, as a streaming client should. The transformer
(wds mode, identity-sized output) is sampled with psutil: server process and
workers. Goal: time to first byte and RSS flat in the shard size.
Run: ``.venv/bin/python bench/wds_stream.py``.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import h11
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from etl_runtime.core.spec import runtime_python_version  # noqa: E402
from tests.servers import free_port, wait_http  # noqa: E402

SAMPLE_BYTES = 256 * 1024


def reverse(sample: dict[str, Any]) -> dict[str, Any]:
    return {"__key__": sample["__key__"], "bin": sample["bin"][::-1]}


def shard_chunks(total_bytes: int) -> Iterator[bytes]:
    block = os.urandom(SAMPLE_BYTES)
    for i in range(total_bytes // SAMPLE_BYTES):
        info = tarfile.TarInfo(f"sample_{i:07d}.bin")
        info.size = SAMPLE_BYTES
        yield info.tobuf(tarfile.USTAR_FORMAT) + block
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.server_peak = self.total_peak = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            try:
                server = self.proc.memory_info().rss
                total = server + sum(
                    c.memory_info().rss for c in self.proc.children(recursive=True)
                )
            except psutil.Error:
                continue
            self.server_peak = max(self.server_peak, server)
            self.total_peak = max(self.total_peak, total)
            time.sleep(0.05)


def transform(url: str, total_bytes: int) -> tuple[float, float, int]:
    host, port = url.removeprefix("http://").split(":")
    conn = h11.Connection(h11.CLIENT)
    sock = socket.create_connection((host, int(port)))
    lock = threading.Lock()
    headers = [("host", host), ("transfer-encoding", "chunked")]

    def send_all() -> None:
        for chunk in shard_chunks(total_bytes):
            with lock:
                data = conn.send(h11.Data(data=chunk))
            sock.sendall(data)
        with lock:
            data = conn.send(h11.EndOfMessage())
        sock.sendall(data)

    start = time.perf_counter()
    sock.sendall(conn.send(h11.Request(method="PUT", target="/b/big.tar", headers=headers)))
    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    first = 0.0
    received = 0
    done = False
    while not done:
        data = sock.recv(1 << 20)
        with lock:
            conn.receive_data(data)
            while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
                if isinstance(event, h11.Data):
                    if not first:
                        first = time.perf_counter() - start
                    received += len(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    done = True
                    break
        if not data:
            break
    elapsed = time.perf_counter() - start
    sender.join()
    sock.close()
    return first, elapsed, received


def main() -> None:
    spec = {
        "mode": "wds",
        "code": {
            "pickled": base64.b64encode(cloudpickle.dumps(reverse)).decode(),
            "pythonVersion": runtime_python_version(),
        },
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SLUICE_ETL_NAME": "stream", "SLUICE_ETL_SPEC": json.dumps(spec)}
    server = subprocess.Popen(
        [sys.executable, "-m", "etl_runtime.webserver", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"{url}/health", timeout=180, proc=server)
        transform(url, 4 << 20)  # warm up
        rows = []
        for mb in (50, 500):
            sampler = RssSampler(server.pid)
            sampler.start()
            ttfb, elapsed, received = transform(url, mb << 20)
            sampler.running = False
            sampler.join()
            rows.append((mb, ttfb, elapsed, received, sampler.server_peak, sampler.total_peak))
            server_mb, total_mb = sampler.server_peak / 1e6, sampler.total_peak / 1e6
            print(
                f"{mb:4d} MB shard: first byte after {ttfb * 1000:7.1f} ms, total {elapsed:6.2f}s "
                f"({received / elapsed / 1e6:6.1f} MB/s out), peak RSS server "
                f"{server_mb:6.1f} MB, server+workers {total_mb:6.1f} MB"
            )
    finally:
        server.terminate()
        server.wait()
    (_, t1, _, _, s1, a1), (_, t2, _, _, s2, a2) = rows
    print(
        f"ratios 500MB/50MB: first byte {t2 / t1:.2f}x, server RSS {s2 / s1:.2f}x, "
        f"server+workers RSS {a2 / a1:.2f}x (goal: ~1, i.e. flat)"
    )


if __name__ == "__main__":
    main()
