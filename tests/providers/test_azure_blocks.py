"""An ``azure`` write-through PUT staged as blocks, with a block interrupted (issue #40).

A ``FaultProxy`` on loopback sits between Sluice and Azurite: it resets one
Put Block after part of its body, or answers every Put Block with a 503 of
its own. The blob is read back from Azurite with the official client.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from etl_runtime.core.errors import BackendUnavailable
from etl_runtime.providers.azure import (
    BLOCK,
    MAX_BLOCK,
    MAX_BLOCKS,
    AzureBackend,
    block_size,
)
from tests.providers.emulators import AZURITE_ACCOUNT, Azurite
from tests.providers.faultproxy import Fault, FaultProxy
from tests.providers.remote_suite import new_bucket

SIZE = 3 * BLOCK + (2 << 20)  # four blocks: 5, 5, 5 and 2 MiB


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(emu: Azurite) -> Iterator[FaultProxy]:
    p = FaultProxy(emu.endpoint)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def body(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("body") / "big.bin"
    path.write_bytes(os.urandom(SIZE))
    return path


def put(emu: Azurite, proxy: FaultProxy, bucket: str, name: str, path: Path) -> None:
    props = {"endpoint": f"{proxy.endpoint}/{AZURITE_ACCOUNT}"}
    backend = AzureBackend.for_bucket(bucket, props, env=emu.env())

    async def go() -> None:
        meta = await backend.put_file(name, path)
        assert meta.size == SIZE

    asyncio.run(go())


def test_a_block_cut_mid_body_goes_again_alone(emu: Azurite, proxy: FaultProxy, body: Path) -> None:
    bucket = new_bucket(emu, {})
    cut = proxy.add(Fault("PUT", "comp=block&", reset=1 << 20))
    put(emu, proxy, bucket, "big.bin", body)
    assert cut.fired == 1
    blocks = [s for s in proxy.seen if "comp=block&" in s.target]
    cut_id = next(s.target for s in blocks if s.fault.startswith("reset"))
    # The block that was cut went again (same block id), the others once each.
    assert [s.target for s in blocks].count(cut_id) == 2 and len(blocks) == 5
    resent = sum(s.sent for s in blocks) - SIZE
    assert resent == 1 << 20  # only the cut block's first MiB went up twice
    assert [s.status for s in proxy.seen if "comp=blocklist" in s.target] == [201]
    assert emu.read(bucket, "big.bin") == body.read_bytes()


def test_a_backend_that_refuses_every_block_is_a_503_and_leaves_no_blob(
    emu: Azurite, proxy: FaultProxy, body: Path
) -> None:
    bucket = new_bucket(emu, {})
    proxy.add(Fault("PUT", "comp=block&", status=503, times=None))
    with pytest.raises(BackendUnavailable) as e:
        put(emu, proxy, bucket, "big.bin", body)
    assert f"azure://{bucket}/big.bin" in str(e.value) and proxy.endpoint in str(e.value)
    # Each block tried 1 + RETRIES times (bounded), the list never committed.
    tries = [s.target for s in proxy.seen if "comp=block&" in s.target]
    assert all(tries.count(t) <= 3 for t in tries)
    assert not [s for s in proxy.seen if "comp=blocklist" in s.target]
    assert emu.read(bucket, "big.bin") is None


def test_the_block_size_keeps_a_big_blob_within_azures_block_count() -> None:
    gib = 1 << 30
    assert block_size(1) == block_size(100 * gib) == BLOCK
    for size in (244 * gib, 245 * gib, 1024 * gib, 190 * 1024 * gib):
        block = block_size(size)
        assert -(-size // block) <= MAX_BLOCKS and block % (1 << 20) == 0, size
    assert block_size(245 * gib) > BLOCK
    assert block_size(10**15) == MAX_BLOCK  # past Azure's largest blob: its largest block
