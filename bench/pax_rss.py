"""Memory for a 64 MiB pax record: the wds transformer and GetBatch's ``ShardReader``.

A shard whose first header is a pax header with one 64 MiB ``comment`` record,
then 8 small samples. ``tarfile`` (under ``webdataset``) and ``ShardReader``
used to read such a header's data whole into memory; now it is refused at its
header block (422 ``UnsafeShard``). Prints each process's RSS (psutil, MiB)
before, at its peak (polled every 10 ms) and after:

* a wds transformer (``python -m etl_runtime.webserver``, 1 worker): the hpush
  ``PUT`` and the ``etl_fqn`` read;
* ``--cluster``: a ``sluice up`` with one target: an ETL GET through the target
  and a GetBatch of a file in the shard (the target assembles it).

Run: ``PYTHONPATH=. .venv/bin/python bench/pax_rss.py [--cluster]``; for the
code before a change, the same with ``PYTHONPATH`` at an export of that tree.
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import httpx
import psutil

from tests.webserver.conftest import pickled_code, transformer

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def same(sample: dict[str, Any]) -> dict[str, Any]:
    return sample


def small_shard() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(8):
            info = tarfile.TarInfo(f"s{i:03d}.txt")
            info.size = 1000
            tar.addfile(info, io.BytesIO(b"x" * 1000))
    return buf.getvalue()


def pax_shard() -> bytes:
    body = b" comment=" + b"x" * (64 << 20) + b"\n"
    n = len(body)
    n += len(str(n + len(str(n))))
    record = str(n).encode() + body
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(record)
    head = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    return head + record + b"\0" * (-len(record) % 512) + small_shard()


def peak(pids: list[int], fn: Callable[[], httpx.Response]) -> tuple[httpx.Response, list[Any]]:
    procs = [psutil.Process(p) for p in pids]
    before = [p.memory_info().rss for p in procs]
    top, stop = list(before), threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for i, p in enumerate(procs):
                try:
                    top[i] = max(top[i], p.memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(0.01)

    t = threading.Thread(target=poll)
    t.start()
    try:
        r = fn()
    finally:
        stop.set()
        t.join()
    after = [p.memory_info().rss for p in procs]
    return r, [(b >> 20, m >> 20, a >> 20) for b, m, a in zip(before, top, after, strict=True)]


def report(what: str, r: httpx.Response, mem: list[Any]) -> None:
    print(f"{what}: {r.status_code} {r.text[:120]!r}")
    print(f"  RSS MiB (before, peak, after): {mem}")


def direct(data: bytes, path: Path) -> None:
    with transformer("same", {"mode": "wds", "code": pickled_code(same)}, workers=1) as url:
        pid = httpx.get(f"{url}/health").json()["pid"]
        httpx.put(f"{url}/b/ok.tar", content=small_shard(), timeout=60)
        r, mem = peak([pid], lambda: httpx.put(f"{url}/b/pax.tar", content=data, timeout=120))
        report("transformer, hpush PUT", r, mem)
        fqn = {"etl_fqn": str(path)}
        r, mem = peak([pid], lambda: httpx.put(f"{url}/b/pax.tar", params=fqn, timeout=120))
        report("transformer, etl_fqn", r, mem)


def cluster(data: bytes) -> None:
    from aistore.sdk import Client

    from etl_runtime import Client as SluiceClient
    from etl_runtime.local import LocalCluster

    with LocalCluster(Path(tempfile.mkdtemp()) / "data", targets=1) as c:
        SluiceClient(c.endpoint).etl("same").init_code(transform=same, mode="wds")
        bck = Client(c.endpoint).bucket("b")
        bck.create(exist_ok=True)
        bck.object("pax.tar").get_writer().put_content(data)
        url = c.endpoint.rstrip("/")
        kids = psutil.Process(c.pid).children(recursive=True)
        target = [p.pid for p in kids if "storage_target" in " ".join(p.cmdline())]
        get = f"{url}/v1/objects/b/pax.tar"
        etl = {"etl_name": "same"}
        r, mem = peak(
            target, lambda: httpx.get(get, params=etl, timeout=120, follow_redirects=True)
        )
        report("target, ETL GET", r, mem)
        batch = {"in": [{"objname": "pax.tar", "archpath": "s001.txt"}], "strm": True}
        moss = f"{url}/v1/ml/moss/b"
        r, mem = peak(
            target,
            lambda: httpx.request("GET", moss, json=batch, timeout=120, follow_redirects=True),
        )
        report("target, GetBatch archpath", r, mem)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", action="store_true", help="also through a sluice up")
    args = parser.parse_args()
    data = pax_shard()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pax.tar"
        path.write_bytes(data)
        direct(data, path)
    if args.cluster:
        cluster(data)


if __name__ == "__main__":
    main()
