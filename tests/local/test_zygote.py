"""ETLs started through the pre-started runtime (zygote) of ``sluice up``.

One real local cluster (gateway, 3 targets; ``SLUICE_ZYGOTE`` at its default,
``eager``) for the module. What a user would notice: ETLs registered with the
SDK are Running and transform correctly in object and wds modes (torch ops in a
forked worker included: the zygote imported torch and never ran it), a killed
transformer is replaced, code that does not load is an Error that names the
ETL, and an ETL with ``dependencies`` still gets them installed (it is started
afresh: installed packages could shadow what the zygote preloaded).
"""

from __future__ import annotations

import io
import os
import signal
import tarfile
import time
from collections.abc import Iterator

import psutil
import pytest

from etl_runtime import Client
from etl_runtime.local.up import LocalCluster
from etl_runtime.sdk.errors import EtlError
from tests.local.conftest import pid_gone


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("zygote") / "data"
    env_before = os.environ.pop("SLUICE_ZYGOTE", None)
    try:
        with LocalCluster(data, targets=3) as c:
            # Wait for the zygote's imports (torch, torchvision: a minute on a busy machine).
            log = data / "etl" / "logs" / "zygote.log"
            deadline = time.monotonic() + 240
            while "sluice zygote: ready" not in (log.read_text() if log.exists() else ""):
                assert time.monotonic() < deadline, f"zygote not ready:\n{c.output[-3000:]}"
                time.sleep(0.2)
            yield c
    finally:
        if env_before is not None:
            os.environ["SLUICE_ZYGOTE"] = env_before


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Client:
    c = Client(cluster.endpoint)
    c.bucket("bkt-z").create()
    return c


def zygote_of(cluster: LocalCluster) -> psutil.Process:
    for p in psutil.Process(cluster.pid).children(recursive=True):
        try:
            if p.name() == "sluice-zygote":
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"no zygote below sluice up:\n{cluster.output[-3000:]}")


def transformers_of(cluster: LocalCluster, etl: str) -> dict[str, int]:
    """{target: transformer pid} from the local controller's pid files."""
    import json

    out = {}
    for f in (cluster.data_dir / "etl" / "run").glob(f"etl-{etl}-*.json"):
        rec = json.loads(f.read_text())
        if not pid_gone(int(rec["pid"])):
            out[rec["target"]] = int(rec["pid"])
    return out


def upper(data: bytes) -> bytes:
    return data.upper()


def test_object_etl_is_forked_by_the_zygote_and_transforms(
    cluster: LocalCluster, client: Client
) -> None:
    client.bucket("bkt-z").object("a.txt").put_content(b"hello zygote")
    details = client.etl("zy-upper").init_code(transform=upper, timeout=120)
    assert details.phase == "Running" and details.ready == 3
    got = client.bucket("bkt-z").object("a.txt").get_bytes(etl_name="zy-upper")
    assert got == b"HELLO ZYGOTE"
    zygote = zygote_of(cluster)
    pids = transformers_of(cluster, "zy-upper")
    assert len(pids) == 3
    assert {psutil.Process(pid).ppid() for pid in pids.values()} == {zygote.pid}
    # Its servers (object code runs inline by default) are forks of the transformer,
    # not fresh interpreters.
    for pid in pids.values():
        names = {k.name() for k in psutil.Process(pid).children(recursive=True)}
        assert names == {"sluice-server"}, names
    client.etl("zy-upper").delete()


def test_wds_etl_runs_torch_in_forked_workers(cluster: LocalCluster, client: Client) -> None:
    pytest.importorskip("torch")  # installed with the dev extras
    from PIL import Image

    def mean_by_torch(sample: dict) -> dict:
        import torch

        torch.set_num_threads(2)  # the first torch call of this process: its own thread pool
        pixels = torch.tensor(list(sample["png"].getdata()), dtype=torch.float32)
        square = pixels.T @ pixels  # a BLAS call through torch's threads
        mean = float(pixels.mean())
        return {
            "__key__": sample["__key__"],
            "txt": f"{mean:.1f} {float(square.trace()):.0f} {torch.get_num_threads()}",
        }

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i, value in enumerate((10, 200)):
            img = io.BytesIO()
            Image.new("RGB", (8, 8), (value, value, value)).save(img, "PNG")
            info = tarfile.TarInfo(f"s{i}.png")
            info.size = len(img.getvalue())
            tar.addfile(info, io.BytesIO(img.getvalue()))
    client.bucket("bkt-z").object("shard.tar").put_content(buf.getvalue())
    client.etl("zy-torch").init_code(transform=mean_by_torch, mode="wds", decode="pil")
    got = client.bucket("bkt-z").object("shard.tar").get_bytes(etl_name="zy-torch")
    with tarfile.open(fileobj=io.BytesIO(got)) as tar:
        out = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}  # type: ignore[union-attr]
    # 64 pixels x 3 channels of value v: the mean is v, the trace 64 * 3 * v^2.
    assert out == {"s0.txt": "10.0 19200 2", "s1.txt": "200.0 7680000 2"}
    client.etl("zy-torch").delete()


def test_a_killed_forked_transformer_is_replaced(cluster: LocalCluster, client: Client) -> None:
    client.bucket("bkt-z").object("k.txt").put_content(b"kill me")
    client.etl("zy-kill").init_code(transform=upper)
    before = transformers_of(cluster, "zy-kill")
    victim_target, victim = sorted(before.items())[0]
    os.killpg(victim, signal.SIGKILL)  # the transformer and its workers
    deadline = time.monotonic() + 90
    while True:
        now = transformers_of(cluster, "zy-kill")
        details = client.etl("zy-kill").details()
        if now.get(victim_target) not in (None, victim) and details.ready == 3:
            break
        assert time.monotonic() < deadline, f"not replaced: {now} {details}"
        time.sleep(0.2)
    assert psutil.Process(now[victim_target]).ppid() == zygote_of(cluster).pid
    got = client.bucket("bkt-z").object("k.txt").get_bytes(etl_name="zy-kill")
    assert got == b"KILL ME"
    client.etl("zy-kill").delete()


def test_code_that_does_not_load_is_an_error_naming_the_etl(client: Client) -> None:
    with pytest.raises(EtlError) as info:
        client.etl("zy-broken").init_spec(
            source="raise RuntimeError('no such model file')\n", entrypoint="transform"
        )
    assert info.value.etl == "zy-broken"
    assert "no such model file" in str(info.value)
    details = client.etl("zy-broken").details()
    assert details.phase == "Error" and "no such model file" in (details.message or "")
    client.etl("zy-broken").delete()


def test_dependencies_are_installed_in_a_fresh_transformer(
    cluster: LocalCluster, client: Client
) -> None:
    def six_version(data: bytes) -> bytes:
        import six

        return six.__version__.encode()

    client.bucket("bkt-z").object("d.txt").put_content(b"x")
    client.etl("zy-deps").init_code(
        transform=six_version, dependencies=["six==1.16.0"], timeout=300
    )
    assert client.bucket("bkt-z").object("d.txt").get_bytes(etl_name="zy-deps") == b"1.16.0"
    zygote = zygote_of(cluster).pid
    assert all(
        psutil.Process(p).ppid() != zygote for p in transformers_of(cluster, "zy-deps").values()
    )
    client.etl("zy-deps").delete()


def test_forked_workers_draw_different_random_numbers(client: Client) -> None:
    """numpy is imported before the fork: each worker must still get its own seed."""

    def draw(data: bytes) -> bytes:
        import numpy as np

        return str(np.random.randint(1 << 62)).encode()

    bucket = client.bucket("bkt-z")
    names = [f"r{i}" for i in range(12)]  # spread over the 3 targets by HRW
    for n in names:
        bucket.object(n).put_content(b"x")
    client.etl("zy-random").init_code(transform=draw, workers=1)
    values = [bucket.object(n).get_bytes(etl_name="zy-random") for n in names]
    # One worker per transformer: with a shared seed the 3 would repeat each other's draws.
    assert len(set(values)) == len(values), values
    client.etl("zy-random").delete()
