"""WebDataset mode over real HTTP, read back with the real ``webdataset`` library."""

from __future__ import annotations

import io
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import h11
import httpx
import numpy as np
import PIL.Image
import pytest
import webdataset as wds

from tests.webserver.conftest import pickled_code, transformer

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def shard_bytes(n: int, corrupt: tuple[str, ...] = (), side: int = 32) -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with wds.TarWriter(buf) as w:
        for i in range(n):
            key = f"sample_{i:06d}"
            pixels = rng.integers(0, 255, (side, side + 16, 3), dtype=np.uint8)
            jpg: Any = b"not a jpeg" if key in corrupt else PIL.Image.fromarray(pixels)
            w.write({"__key__": key, "jpg": jpg, "cls": i, "json": {"i": i}})
    return buf.getvalue()


def read_shard(data: bytes, tmp_path: Path, decode: str = "pil") -> list[dict[str, Any]]:
    path = tmp_path / "out.tar"
    path.write_bytes(data)
    return list(wds.WebDataset(str(path), shardshuffle=False).decode(decode))


def thumbnail(sample: dict[str, Any], args: str | None) -> dict[str, Any] | None:
    """PIL-decoded sample → 8x8 PNG; ``etl_args`` picks failures and drops."""
    cmd, _, arg = (args or "").partition(":")
    key = sample["__key__"]
    if cmd == "fail" and key == arg:
        raise ValueError(f"refusing {key}")
    if cmd == "drop_odd" and sample["cls"] % 2:
        return None
    image = sample["jpg"]
    return {
        "__key__": key,
        "png": image.resize((8, 8)),
        "cls": sample["cls"],
        "json": {"key": key, "mode": image.mode, "size": list(image.size)},
    }


def halve(sample: dict[str, Any]) -> dict[str, Any]:
    """rgb-decoded (float numpy) sample → every other pixel, as JPEG."""
    if sample["cls"] == 3:
        raise RuntimeError("three is unlucky")
    return {"__key__": sample["__key__"], "jpg": sample["jpg"][::2, ::2], "cls": sample["cls"]}


@pytest.fixture(scope="module")
def pil_url() -> Iterator[str]:
    spec = {"mode": "wds", "decode": "pil", "code": pickled_code(thumbnail)}
    with transformer("thumbs", spec, workers=2) as url:
        yield url


@pytest.fixture(scope="module")
def skip_url() -> Iterator[str]:
    spec = {"mode": "wds", "decode": "rgb", "onError": "skip", "code": pickled_code(halve)}
    with transformer("halve", spec, workers=2) as url:
        yield url


def test_samples_transformed_in_order_with_keys_and_fields(pil_url: str, tmp_path: Path) -> None:
    r = httpx.put(f"{pil_url}/b/shard-000.tar", content=shard_bytes(25), timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-tar"
    samples = read_shard(r.content, tmp_path)
    assert [s["__key__"] for s in samples] == [f"sample_{i:06d}" for i in range(25)]
    for i, s in enumerate(samples):
        assert set(s) >= {"__key__", "png", "cls", "json"} and "jpg" not in s
        assert s["png"].size == (8, 8)
        assert s["cls"] == i
        assert s["json"] == {"key": s["__key__"], "mode": "RGB", "size": [48, 32]}


def test_none_drops_samples(pil_url: str, tmp_path: Path) -> None:
    r = httpx.put(
        f"{pil_url}/b/s.tar", content=shard_bytes(10), params={"etl_args": "drop_odd"}, timeout=60
    )
    assert [s["cls"] for s in read_shard(r.content, tmp_path)] == [0, 2, 4, 6, 8]


def test_fqn_shard(pil_url: str, tmp_path: Path) -> None:
    path = tmp_path / "in.tar"
    path.write_bytes(shard_bytes(6))
    r = httpx.put(f"{pil_url}/b/in.tar", params={"etl_fqn": str(path)}, timeout=60)
    assert r.status_code == 200
    assert [s["cls"] for s in read_shard(r.content, tmp_path)] == list(range(6))


def test_fail_on_first_sample_is_json_naming_the_sample(pil_url: str) -> None:
    r = httpx.put(
        f"{pil_url}/b/s.tar",
        content=shard_bytes(5),
        params={"etl_args": "fail:sample_000000"},
        timeout=60,
    )
    assert r.status_code == 422
    body = r.json()
    assert body["sample"] == "sample_000000" and body["object"] == "b/s.tar"
    assert body["etl"] == "thumbs" and "refusing sample_000000" in body["error"]
    assert "ValueError" in body["detail"]


def test_fail_after_streaming_began_aborts(pil_url: str) -> None:
    # The answer is cut: a body that never ends, or, when the server aborts before it
    # read all of this request's body, a reset (seen once under -n 2: ReadError).
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        with httpx.stream(
            "PUT",
            f"{pil_url}/b/late.tar",
            content=shard_bytes(30),
            params={"etl_args": "fail:sample_000020"},
            timeout=60,
        ) as r:
            assert r.status_code == 200
            r.read()
    stats = httpx.get(f"{pil_url}/stats").json()
    assert any(
        e["object"] == "b/late.tar" and e["sample"] == "sample_000020" for e in stats["last_errors"]
    )


def test_not_a_tar_is_400_naming_the_object(pil_url: str) -> None:
    r = httpx.put(f"{pil_url}/b/notes.txt", content=b"just some text\n" * 200, timeout=30)
    assert r.status_code == 400
    body = r.json()
    assert body["kind"] == "NotATar" and "'b/notes.txt' is not a tar shard" in body["error"]


def test_skip_drops_failing_and_undecodable_samples(skip_url: str, tmp_path: Path) -> None:
    before = httpx.get(f"{skip_url}/stats").json()
    data = shard_bytes(8, corrupt=("sample_000005",))
    r = httpx.put(f"{skip_url}/b/mixed.tar", content=data, timeout=60)
    assert r.status_code == 200
    samples = read_shard(r.content, tmp_path, decode="rgb")
    assert [s["cls"] for s in samples] == [0, 1, 2, 4, 6, 7]
    assert samples[0]["jpg"].shape == (16, 24, 3)
    after = httpx.get(f"{skip_url}/stats").json()
    assert after["skipped"] == before["skipped"] + 2
    assert after["samples"] == before["samples"] + 6
    assert after["objects"] == before["objects"] + 1
    recent = {e["sample"]: e["error"] for e in after["last_errors"][-2:]}
    assert "three is unlucky" in recent["sample_000003"]
    assert "does not decode" in recent["sample_000005"]


def test_output_starts_before_the_input_ends(pil_url: str, tmp_path: Path) -> None:
    """Send half a shard, see transformed samples come back, only then send the rest."""
    data = shard_bytes(60, side=64)
    half = len(data) // 2
    host, port = pil_url.removeprefix("http://").split(":")
    conn = h11.Connection(h11.CLIENT)
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        headers = [("host", host), ("transfer-encoding", "chunked")]
        sock.sendall(conn.send(h11.Request(method="PUT", target="/b/big.tar", headers=headers)))
        sock.sendall(conn.send(h11.Data(data=data[:half])))
        body = bytearray()
        events: list[Any] = []
        while not body:  # blocks (20 s timeout) until the first output bytes arrive
            conn.receive_data(sock.recv(65536))
            while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
                events.append(event)
                if isinstance(event, h11.Data):
                    body += event.data
        assert isinstance(events[0], h11.Response) and events[0].status_code == 200
        sock.sendall(conn.send(h11.Data(data=data[half:])))
        sock.sendall(conn.send(h11.EndOfMessage()))
        while not any(isinstance(e, h11.EndOfMessage) for e in events):
            conn.receive_data(sock.recv(65536))
            while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
                events.append(event)
                if isinstance(event, h11.Data):
                    body += event.data
    assert [s["cls"] for s in read_shard(bytes(body), tmp_path)] == list(range(60))
