"""The ETL output cache: a second epoch costs no compute (issue 23 item 3).

One target (``python -m etl_runtime.storage_target``, ``SLUICE_ETL_FQN=always``
as under ``sluice up``) and one transformer (``python -m etl_runtime.webserver``,
``--transformer-workers`` worker processes) running a CPU-heavy ETL: decode a
JPEG with PIL, resize it to 224x224, encode it again. The target knows it
twice, from a ``FileRegistry`` this script writes: ``resize`` (``cache``
off: the default answer path, a 307 to the transformer, which answers the
client) and ``resize-cached`` (``cache: true``). Same code, so the same
transformer serves both. ``--objects`` JPEGs (``--width`` x ``--height``,
generated here: gradients and noise) are uploaded once.

Each round reads every object exactly once per row (an epoch: ``loadgen.run_once``,
``--clients`` connections from ``--client-procs`` processes, straight to the
target, following the 307 like any client):

* ``plain``: plain GETs of the JPEGs (zero-copy, ``os.sendfile``);
* ``plain, answer-sized``: plain GETs of objects holding the transformed
  answers (stored once at the start), so the same bytes as a hit;
* ``epoch 1, cache off``: ``?etl_name=resize``;
* ``epoch 1, cache on``: ``?etl_name=resize-cached&etl_args=round-N`` (new
  arguments each round, so every object is a miss: the target relays the
  answer and keeps a copy);
* ``epoch 2, cache on``: the same again: every object a hit, served by the
  target like a plain GET.

Printed per row: objects/s, MiB/s, latency p50/p99, CPU ms per object of the
target, of the transformer (server and workers) and of the load generator;
then the ratios, medians over ``--rounds``: epoch 2 ÷ plain (objects/s; the
goal is >= 0.9), also against the answer-sized plain GETs, and epoch 1 cache
on ÷ cache off (the price of relaying and keeping the answer instead of the
307; goal >= 0.9), with the servers' CPU per object beside it (on 2 shared
cores the rates of the transform-bound rows swing with other load; the CPU
is the steadier figure). The run fails if an epoch 2 ran the transform (the
transformer's ``/stats`` object counter moved) or a row had errors.

    .venv/bin/python bench/etl_cache.py [--objects 200] [--clients 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from etl_runtime.cluster.records import EtlRecord, TransformerStatus  # noqa: E402
from etl_runtime.core import auth  # noqa: E402
from etl_runtime.core.spec import EtlSpec  # noqa: E402
from tests.servers import free_port, serve_process  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from loadgen import Req, Result, run_once, tree_cpu  # noqa: E402

RESIZE = """
import io
from PIL import Image

def transform(data, args):
    with Image.open(io.BytesIO(data)) as img:
        small = img.convert("RGB").resize((224, 224), Image.BICUBIC)
    out = io.BytesIO()
    small.save(out, "JPEG", quality=90)
    return out.getvalue()
"""
SPEC = {"mode": "object", "code": {"source": RESIZE}}
ETLS = {"resize": False, "resize-cached": True}  # name -> cache
ROWS = (
    "plain",
    "plain, answer-sized",
    "epoch 1, cache off",
    "epoch 1, cache on",
    "epoch 2, cache on",
)


def jpegs(n: int, width: int, height: int) -> Iterator[bytes]:
    """``n`` different photo-sized JPEGs: a colour gradient under noise."""
    from PIL import Image

    for i in range(n):
        noise = Image.effect_noise((width, height), 40 + i % 20).convert("RGB")
        gradient = Image.linear_gradient("L").resize((width, height)).rotate(i * 7 % 360)
        tint = Image.new("RGB", (width, height), ((i * 37) % 256, (i * 91) % 256, 128))
        img = Image.blend(Image.composite(tint, noise, gradient), noise, 0.3)
        out = io.BytesIO()
        img.save(out, "JPEG", quality=85)
        yield out.getvalue()


@contextlib.contextmanager
def servers(workdir: Path, args: argparse.Namespace) -> Iterator[tuple[str, str, int, int]]:
    """(target URL, transformer URL, target pid, transformer pid)."""
    key = auth.new_key()
    data = workdir / "target"
    with contextlib.ExitStack() as stack:
        port = free_port()
        tf_url = f"http://127.0.0.1:{port}"
        argv = ["-m", "etl_runtime.webserver", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--workers", str(args.transformer_workers)]
        tf_env = {  # no SLUICE_ETL_TOKEN: both ETL records may use this transformer
            "SLUICE_ETL_NAME": "resize",
            "SLUICE_ETL_SPEC": json.dumps(SPEC),
            "SLUICE_DATA_ROOTS": str(data),
        }
        tf = stack.enter_context(serve_process(argv, f"{tf_url}/health", tf_env, timeout=120))
        registry = workdir / "etl"
        registry.mkdir()
        for name, cache in ETLS.items():
            record = EtlRecord(
                name=name,
                uid="bench",
                spec=EtlSpec.from_dict({**SPEC, "cache": cache}),
                phase="Running",
                transformers=(TransformerStatus("t0", tf_url, ready=True),),
            )
            (registry / f"{name}.json").write_text(json.dumps(record.to_dict()))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = ["-m", "etl_runtime.storage_target", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--id", "t0", "--data-dir", str(data), "--registry", f"file:{registry}"]
        env = {"SLUICE_CLUSTER_KEY": key, "SLUICE_ETL_FQN": "always"}
        target = stack.enter_context(serve_process(argv, f"{url}/v1/health", env))
        yield url, tf_url, target.pid, tf.pid


def measure(reqs: list[Req], args: argparse.Namespace, pids: dict[str, int]) -> dict:
    before = {role: tree_cpu(pid) for role, pid in pids.items()}
    result: Result = run_once(reqs, args.clients, args.client_procs)
    if result.errors:
        raise SystemExit(f"{result.errors} errors, first: {result.first_error}")
    n = max(1, result.requests)
    row = {
        "rate": result.rate,
        "mibs": result.nbytes / result.seconds / (1 << 20),
        "p50": result.p50_ms,
        "p99": result.p99_ms,
        "client_ms": result.client_cpu_ms,
    }
    for role, pid in pids.items():  # over the whole row, set-up included: a bound
        row[f"{role}_ms"] = (tree_cpu(pid) - before[role]) * 1e3 / n
    return row


def transformed(tf_url: str) -> int:
    return int(httpx.get(f"{tf_url}/stats", timeout=10).json()["objects"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--objects", type=int, default=200, help="JPEGs read per epoch")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--height", type=int, default=768)
    p.add_argument("--clients", type=int, default=8, help="concurrent requests")
    p.add_argument("--client-procs", type=int, default=2, help="load generator processes")
    p.add_argument("--transformer-workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp,
        servers(Path(tmp), args) as (url, tf_url, target_pid, tf_pid),
    ):
        pids = {"target": target_pid, "transformer": tf_pid}
        sizes: dict[str, int] = {}
        with httpx.Client(base_url=url, timeout=120) as c:
            c.post("/v1/buckets/bench", json={"action": "create-bck"}).raise_for_status()
            for i, jpeg in enumerate(jpegs(args.objects, args.width, args.height)):
                name = f"img/{i:05d}.jpg"
                c.put(f"/v1/objects/bench/{name}", content=jpeg).raise_for_status()
                sizes[name] = len(jpeg)
            for name in list(sizes):  # the answers as objects of their own
                r = c.get(f"/v1/objects/bench/{name}?etl_name=resize", follow_redirects=True)
                r.raise_for_status()
                out = name.replace("img/", "out/")
                c.put(f"/v1/objects/bench/{out}", content=r.content).raise_for_status()
                sizes[out] = len(r.content)
        images = [n for n in sizes if n.startswith("img/")]
        answers = [n for n in sizes if n.startswith("out/")]
        mean_in = statistics.mean(sizes[n] for n in images) / 1024
        mean_out = statistics.mean(sizes[n] for n in answers) / 1024
        print(
            f"{os.cpu_count()} CPUs; {args.objects} JPEGs of {args.width}x{args.height} "
            f"(mean {mean_in:.0f} KiB) -> 224x224 (mean {mean_out:.1f} KiB); "
            f"{args.clients} connections from "
            f"{args.client_procs} load generator processes; transformer workers "
            f"{args.transformer_workers}"
        )
        head = (
            "| round | row | objects/s | MiB/s | p50 ms | p99 ms | target CPU ms/obj "
            "| transformer CPU ms/obj | load generator CPU ms/obj |"
        )
        print(head)
        print("|---" * (head.count("|") - 1) + "|")
        base = f"{url}/v1/objects/bench/"
        rows: dict[str, list[dict]] = {r: [] for r in ROWS}
        for rnd in range(1, args.rounds + 1):
            queries = {
                "plain": "",
                "plain, answer-sized": "",
                "epoch 1, cache off": "?etl_name=resize",
                "epoch 1, cache on": f"?etl_name=resize-cached&etl_args=round-{rnd}",
                "epoch 2, cache on": f"?etl_name=resize-cached&etl_args=round-{rnd}",
            }
            for row_name, query in queries.items():
                if row_name == "epoch 2, cache on":
                    time.sleep(0.5)  # epoch 1's last answers are kept in the background
                before = transformed(tf_url)
                plain = row_name.startswith("plain")  # ETL answers: any length but 0
                names = answers if row_name == "plain, answer-sized" else images
                reqs = [
                    Req("GET", base + n + query, expect_len=sizes[n] if plain else None)
                    for n in names
                ]
                row = measure(reqs, args, pids)
                ran = transformed(tf_url) - before
                want = 0 if plain or row_name.startswith("epoch 2") else args.objects
                if ran != want:
                    raise SystemExit(f"round {rnd}, {row_name}: {ran} transforms, expected {want}")
                rows[row_name].append(row)
                print(
                    f"| {rnd} | {row_name} | {row['rate']:.0f} | {row['mibs']:.1f} | "
                    f"{row['p50']:.1f} | {row['p99']:.1f} | {row['target_ms']:.2f} | "
                    f"{row['transformer_ms']:.2f} | {row['client_ms']:.2f} |",
                    flush=True,
                )
        plain, same, off, on, again = (rows[r] for r in ROWS)

        def ratio(a: list[dict], b: list[dict], key: str = "rate") -> list[float]:
            return [x[key] / y[key] for x, y in zip(a, b, strict=True)]

        for row in (*off, *on):
            row["servers_ms"] = row["target_ms"] + row["transformer_ms"]
        print()
        print("| ratio (median of the rounds; each round) | value |")
        print("|---|---|")
        for label, xs in (
            ("epoch 2 ÷ plain GET, objects/s (goal >= 0.9)", ratio(again, plain)),
            ("epoch 2 ÷ plain GET of answer-sized objects, objects/s", ratio(again, same)),
            ("target CPU per object, epoch 2 ÷ plain GET", ratio(again, plain, "target_ms")),
            ("target CPU per object, epoch 2 ÷ answer-sized", ratio(again, same, "target_ms")),
            ("epoch 1 cache on ÷ cache off, objects/s (goal >= 0.9)", ratio(on, off)),
            ("epoch 1 cache on ÷ cache off, server CPU per object", ratio(on, off, "servers_ms")),
            ("epoch 1 cache on ÷ cache off, target CPU per object", ratio(on, off, "target_ms")),
        ):
            each = ", ".join(f"{x:.2f}" for x in xs)
            print(f"| {label} | **{statistics.median(xs):.2f}** ({each}) |")
        metrics = httpx.get(f"{url}/metrics").text
        print()
        print("\n".join(ln for ln in metrics.splitlines() if ln.startswith("sluice_etl_cache_")))


if __name__ == "__main__":
    main()
