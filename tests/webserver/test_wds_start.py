"""A wds transformer whose code needs no torch does not load it.

webdataset's package imports torch for its dataset classes; the wds codecs the
transformer uses (``autodecode``, ``writer``) do not need it. CUDA torch is
about 4 s of CPU per process tree, so a bare wds transformer that loaded it
took 30-60 s to get ready on a loaded machine. What a user notices: the
transformer decodes and encodes samples (a PNG decoded to PIL and back), and
none of its processes (server, forker, workers) has torch's library mapped.
"""

from __future__ import annotations

import io
import sys
import tarfile
from typing import Any

import cloudpickle
import httpx
import psutil
from PIL import Image

from tests.webserver.conftest import pickled_code, transformer

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def half(sample: dict[str, Any]) -> dict[str, Any]:
    """Halve a decoded PIL image (PIL, not torch)."""
    image = sample["png"]
    size = (image.width // 2, image.height // 2)
    return {"__key__": sample["__key__"], "png": image.resize(size)}


def shard() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        img = io.BytesIO()
        Image.new("RGB", (8, 6), (10, 20, 30)).save(img, "PNG")
        info = tarfile.TarInfo("s0.png")
        info.size = len(img.getvalue())
        tar.addfile(info, io.BytesIO(img.getvalue()))
    return buf.getvalue()


def maps_torch(proc: psutil.Process) -> bool:
    with open(f"/proc/{proc.pid}/maps") as f:
        return "libtorch" in f.read()


def test_a_wds_transformer_without_torch_code_never_loads_torch() -> None:
    spec = {"mode": "wds", "decode": "pil", "code": pickled_code(half)}
    with transformer("half", spec, workers=2) as url:
        r = httpx.put(f"{url}/b/in.tar", content=shard(), timeout=60)
        assert r.status_code == 200, r.text
        with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
            member = tar.extractfile("s0.png")
            assert member is not None
            assert Image.open(member).size == (4, 3)
        server = psutil.Process(httpx.get(f"{url}/health").json()["pid"])
        tree = [server, *server.children(recursive=True)]
        assert len(tree) >= 4  # server, forker, two workers
        assert [p.pid for p in tree if maps_torch(p)] == []
