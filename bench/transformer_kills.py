"""What readers see while an ETL's transformers are killed with -9 (issue 20 #4b).

A real ``sluice up`` (3 targets by default) serves an object-mode ETL; three
readers loop over ETL GETs of its objects, each in its own thread:

* ``sdk``: ``etl_runtime.Client`` (default retries), ``get_bytes(etl_name=...)``;
* ``aistore``: the official ``aistore`` SDK, ``get_reader(etl=ETLConfig(...)).read_all()``;
* ``httpx``: plain ``httpx.Client(follow_redirects=True)``, no retries.

Meanwhile every ``--interval`` seconds all transformer processes of the ETL are
killed with SIGKILL (``--kills`` times). Each answer is counted per reader by
outcome: ``ok`` (the right bytes), ``wrong`` (other bytes: must never happen),
``503+RA`` (503 with ``Retry-After``), another status, or the exception's type
(a raw transport error the caller had to handle). ``retried`` counts the
transport errors and 503s the SDKs absorbed by their own retries (their log).

Run: ``PYTHONPATH=. .venv/bin/python bench/transformer_kills.py [--kills 4 --interval 6]``.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from etl_runtime import Client  # noqa: E402
from etl_runtime.local import LocalCluster  # noqa: E402
from etl_runtime.sdk import errors as sdk_errors  # noqa: E402

OBJECTS = 24
SPEC = {
    "mode": "object",
    "workers": 1,
    "code": {
        "source": "import time\n\ndef transform(data):\n    time.sleep(0.005)\n"
        "    return data.upper()\n"
    },
}


def payload(i: int) -> bytes:
    return (f"object {i} " * (200 + 50 * i)).encode()


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.examples: dict[tuple[str, str], str] = {}

    def add(self, reader: str, outcome: str, example: str = "") -> None:
        with self.lock:
            self.outcomes[reader][outcome] += 1
            self.examples.setdefault((reader, outcome), example[:300])


class RetryLog(logging.Handler):
    """Counts the retries an SDK logs (what it absorbed for its caller)."""

    def __init__(self, counts: Counts, reader: str) -> None:
        super().__init__(logging.INFO)
        self.counts, self.reader = counts, reader

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "try " in msg or "Retrying" in msg or "retry" in msg.lower():
            self.counts.add(self.reader, "retried", msg)


def transformer_leaders(up_pid: int, etl: str) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(up_pid).children(recursive=True):
        try:
            cmd = p.cmdline()
            if "etl_runtime.webserver" in cmd and os.getsid(p.pid) == p.pid:
                if p.environ().get("SLUICE_ETL_NAME") == etl:
                    out.append(p)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    return out


def read_loop(reader: str, endpoint: str, stop: threading.Event, counts: Counts) -> None:
    import random

    rng = random.Random(reader)
    if reader == "sdk":
        client = Client(endpoint)
        bucket = client.bucket("b")

        def get(i: int) -> tuple[str, str]:
            try:
                data = bucket.object(f"o{i}").get_bytes(etl_name="upper")
            except sdk_errors.Unavailable as e:
                return "503 (retries spent)", str(e)
            except sdk_errors.HTTPError as e:
                return f"{e.status} {e.kind}", str(e)
            except sdk_errors.SluiceError as e:
                return type(e).__name__, str(e)
            return ("ok" if data == payload(i).upper() else "wrong"), ""

    elif reader == "aistore":
        from aistore.sdk import Client as AisClient
        from aistore.sdk.etl import ETLConfig

        ais = AisClient(endpoint)
        abck = ais.bucket("b")

        def get(i: int) -> tuple[str, str]:
            try:
                data = abck.object(f"o{i}").get_reader(etl=ETLConfig("upper")).read_all()
            except Exception as e:  # what the caller must handle
                return type(e).__name__, str(e)
            return ("ok" if data == payload(i).upper() else "wrong"), ""

    else:
        http = httpx.Client(follow_redirects=True, timeout=30, trust_env=False)

        def get(i: int) -> tuple[str, str]:
            try:
                r = http.get(f"{endpoint}/v1/objects/b/o{i}", params={"etl_name": "upper"})
            except httpx.HTTPError as e:
                return type(e).__name__, str(e)
            if r.status_code == 200:
                return ("ok" if r.content == payload(i).upper() else "wrong"), ""
            if r.status_code == 503 and r.headers.get("retry-after"):
                return "503+RA", r.text
            return str(r.status_code), r.text

    while not stop.is_set():
        outcome, example = get(rng.randrange(OBJECTS))
        counts.add(reader, outcome, example)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", type=int, default=3)
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--interval", type=float, default=6.0, help="seconds between kills")
    ap.add_argument("--readers", default="sdk,aistore,httpx")
    args = ap.parse_args()

    counts = Counts()
    for reader, name in (("sdk", "etl_runtime.sdk"), ("aistore", "")):
        handler = RetryLog(counts, reader)
        lg = logging.getLogger(name) if name else logging.getLogger()
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    logging.getLogger("etl_runtime.sdk").propagate = False
    for noisy in ("httpx", "urllib3", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
        logging.getLogger(noisy).propagate = False

    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp) / "data", targets=args.targets) as cluster,
    ):
        c = httpx.Client(base_url=cluster.endpoint, follow_redirects=True, timeout=60)
        assert c.post("/v1/buckets/b", json={"action": "create-bck"}).status_code == 200
        for i in range(OBJECTS):
            assert c.put(f"/v1/objects/b/o{i}", content=payload(i)).status_code == 200
        assert c.put("/v1/etl", json={"name": "upper", "spec": SPEC}).status_code == 200
        deadline = time.monotonic() + 120
        while c.get("/v1/etl/upper").json().get("phase") != "Running":
            assert time.monotonic() < deadline, "ETL not Running"
            time.sleep(0.3)

        stop = threading.Event()
        threads = [
            threading.Thread(target=read_loop, args=(r, cluster.endpoint, stop, counts))
            for r in args.readers.split(",")
        ]
        started = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(2)
        for k in range(args.kills):
            victims = transformer_leaders(cluster.pid, "upper")
            for p in victims:
                p.send_signal(signal.SIGKILL)
            print(f"kill {k + 1}: {len(victims)} transformers", flush=True)
            time.sleep(args.interval)
        stop.set()
        for t in threads:
            t.join(120)
        elapsed = time.monotonic() - started
        phase = c.get("/v1/etl/upper").json().get("phase")

    print(
        f"\n{args.targets} targets, {args.kills} kills of every transformer "
        f"{args.interval:g}s apart, {elapsed:.0f}s of reads; ETL phase after: {phase}"
    )
    for reader in args.readers.split(","):
        got = counts.outcomes[reader]
        print(f"  {reader:8s} " + ", ".join(f"{k}: {v}" for k, v in sorted(got.items())))
    print("examples:")
    for (reader, outcome), example in sorted(counts.examples.items()):
        if outcome not in ("ok",) and example:
            print(f"  {reader} {outcome}: {example}")


if __name__ == "__main__":
    main()
