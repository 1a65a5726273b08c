"""Silent short reads: a wds ETL that fails mid-shard, read with ``wds.WebDataset(url)``.

A wds transformer (2 worker processes) fails on sample 60 of a 200-sample
shard, after it streamed samples 0-59, in two ways: the user function raises
(``on_error="fail"``), or the worker process exits (``os._exit``). Each shard
is read ``--reads`` times with the real ``webdataset`` library, which opens
the URL with ``curl -f -s -L`` (the direct GET a target's 307 leads to:
``GET {transformer}/b/shard.tar?etl_fqn=...``). Every read must raise; a read
that ends without an exception is a *silent short read* (the reader took the
shard for a complete one). ``--via target`` reads through a storage target
that relays the transformer's answer (the hpush ``PUT``), ``--via pipeline``
through ``?etl_name=first&etl_pipeline=second`` (both ETLs the same
transformer; the first step fails).

Run: ``PYTHONPATH=. .venv/bin/python bench/wds_midstream.py --reads 200 [--via ...]``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import webdataset as wds

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from etl_runtime.storage_target import create_target_app  # noqa: E402
from tests.servers import serve_in_thread  # noqa: E402
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry, record  # noqa: E402
from tests.webserver.conftest import source_code, text_shard, transformer  # noqa: E402

VIA_HELP = (
    "direct: GET the transformer (where a target's 307 leads); target: GET a target that "
    "relays (the hpush PUT); pipeline: ?etl_name=first&etl_pipeline=second on a target"
)
SAMPLES = 200
FAIL_AT = 60
CODE = """
import os

def transform(sample):
    if sample["__key__"] == "s0060":
        if os.environ.get("HOW") == "exit":
            os._exit(3)
        raise ValueError("sample 60 is poisoned")
    return {"__key__": sample["__key__"], "txt": sample["txt"].upper()}
"""


def read_once(url: str) -> tuple[str, int]:
    """``(outcome, samples)``: ``silent`` (no exception), or the exception's type."""
    n = 0
    try:
        for _ in wds.WebDataset(url, shardshuffle=False):
            n += 1
    except Exception as e:  # what a user's loop would see
        return type(e).__name__, n
    return ("complete" if n == SAMPLES else "silent"), n


@contextlib.contextmanager
def reader_url(how: str, via: str, shard: Path, tmp: Path) -> Iterator[str]:
    """The URL webdataset reads: the transformer's direct GET, or a target's relay."""
    spec = {"mode": "wds", "code": source_code(CODE)}
    with transformer(f"midstream-{how}", spec, workers=2, HOW=how) as base:
        if via == "direct":
            yield f"{base}/b/shard.tar?etl_fqn={shard}"
            return
        registry = DictRegistry()
        for name in ("first", "second"):
            registry.put(record(name, {"t0": base}, mode="wds"))
        app = create_target_app("t0", tmp / f"target-{how}", registry, cluster_key=CLUSTER_KEY)
        with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as c:
            c.post("/v1/buckets/b", json={"action": "create-bck"}).raise_for_status()
            c.put("/v1/objects/b/shard.tar", content=shard.read_bytes()).raise_for_status()
            query = "etl_name=first" + ("&etl_pipeline=second" if via == "pipeline" else "")
            yield f"{url}/v1/objects/b/shard.tar?{query}"


def measure(how: str, via: str, reads: int, shard: Path) -> collections.Counter[str]:
    outcomes: collections.Counter[str] = collections.Counter()
    short: list[int] = []  # samples of each silent read
    with reader_url(how, via, shard, shard.parent) as url:
        started = time.monotonic()
        for _ in range(reads):
            outcome, n = read_once(url)
            outcomes[outcome] += 1
            if outcome == "silent":
                short.append(n)
        took = time.monotonic() - started
    sizes = f" (samples {min(short)}-{max(short)})" if short else ""
    print(
        f"{how} via {via}: {reads} reads in {took:.0f}s: silent short reads "
        f"{outcomes['silent']}/{reads}{sizes}; {dict(outcomes)}",
        flush=True,
    )
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--how", choices=("raise", "exit"), action="append")
    parser.add_argument(
        "--via", choices=("direct", "target", "pipeline"), default="direct", help=VIA_HELP
    )
    opts = parser.parse_args()
    logging.disable(logging.ERROR)  # the target's tracebacks of each broken relay
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "shard.tar"
        shard.write_bytes(text_shard([f"s{i:04d}" for i in range(SAMPLES)], size=2_000))
        assert len(list(tarfile.open(shard).getmembers())) == SAMPLES
        for how in opts.how or ("raise", "exit"):
            measure(how, opts.via, opts.reads, shard)


if __name__ == "__main__":
    main()
