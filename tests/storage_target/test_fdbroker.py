"""The target's file broker over its real Unix socket: it hands an object's open file
for a grant it signed for the asking uid's ETL, and refuses every other ask file
by file, naming no path (``storage_target/fdbroker.py``, ``etl/grants.py``).

The uid table maps this test's own uid to ETL ``mine``, as ``sluice up``'s maps
each ETL's uid (``local/runas.py``); ``tests/local/test_isolation.py`` asks it
as other uids under a real ``sluice up``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from etl_runtime.etl import grants
from etl_runtime.storage_target.fdbroker import FdBroker

pytestmark = pytest.mark.skipif(not hasattr(socket, "recv_fds"), reason="no SCM_RIGHTS here")

KEY = "k" * 64


def broker_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, etls: dict[str, int]) -> Any:
    (tmp_path / "buckets" / "b").mkdir(parents=True, exist_ok=True)
    (tmp_path / "etl-uids.json").write_text(json.dumps({"next": 9, "etls": etls}))
    monkeypatch.setenv(grants.ENV, str(tmp_path / "fd.sock"))
    monkeypatch.setenv(grants.UIDS_ENV, f"{os.getuid()}:{tmp_path / 'etl-uids.json'}")
    forwarder = SimpleNamespace(grant_key=None)
    target = SimpleNamespace(
        id="t0", store=SimpleNamespace(buckets_dir=tmp_path / "buckets"), forwarder=forwarder
    )
    return FdBroker(target, KEY)  # type: ignore[arg-type]


async def ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asks: list[tuple[str, str | None]]
) -> tuple[list[int | str], Any]:
    broker = broker_at(tmp_path, monkeypatch, {"mine": 0})
    await broker.start()
    try:
        client = grants.BrokerClient(str(tmp_path / "fd.sock"))
        return await client.open(asks), broker
    finally:
        await broker.stop()


def read_and_close(fd: int) -> bytes:
    try:
        with open(grants.fd_path(fd), "rb") as f:  # a path code can open: the handed file
            return f.read()
    finally:
        os.close(fd)


def test_a_grant_of_the_target_hands_the_file_and_nothing_else_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = tmp_path / "buckets" / "b" / "o"
    other = tmp_path / "buckets" / "b" / "other"
    outside = tmp_path / "cluster-key"
    (tmp_path / "buckets" / "b").mkdir(parents=True, exist_ok=True)
    for f, data in ((obj, b"the object"), (other, b"another"), (outside, b"secret")):
        f.write_bytes(data)
    (tmp_path / "buckets" / "b" / "link").symlink_to(outside)
    key = grants.grant_key(KEY, "t0")
    o, ln = str(obj), str(tmp_path / "buckets" / "b" / "link")
    asks: list[tuple[str, str | None]] = [
        (o, grants.sign(key, "mine", o)),
        (o, None),
        (o, "9999999999." + "0" * 40),
        (o, grants.sign(key, "theirs", o)),  # another ETL's grant
        (o, grants.sign(key, "mine", str(other))),  # another object's
        (o, grants.sign(key, "mine", o, now=time.time() - 2 * grants.TTL_SECONDS)),
        (o, grants.sign(grants.grant_key(KEY, "t1"), "mine", o)),  # another target's
        (str(outside), grants.sign(key, "mine", str(outside))),  # signed, yet not an object
        (ln, grants.sign(key, "mine", ln)),
        (str(tmp_path / "buckets" / "b" / "gone"), grants.sign(key, "mine", "x")),
        (o + "\x00", grants.sign(key, "mine", o + "\x00")),  # no open() of it, no crash
    ]
    got, broker = asyncio.run(ask(tmp_path, monkeypatch, asks))
    assert isinstance(got[0], int) and read_and_close(got[0]) == b"the object"
    assert got[1] == "no grant from the target"
    for why in got[2:5] + [got[6], got[9]]:
        assert why == "the grant is not the target's for this object and ETL 'mine'", got
    assert got[5] == "the grant expired; ask the gateway again"
    assert got[7] == got[10] == "not an object of this target"
    assert isinstance(got[8], str) and got[8].startswith("cannot open the object's file"), got
    assert not any(str(tmp_path) in str(g) for g in got)  # the answers name no path
    assert (broker.handed, broker.refused) == (1, 10)
    assert broker.target.forwarder.grant_key == key  # the target signs its etl_fqn now


def test_a_uid_of_no_etl_gets_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = broker_at(tmp_path, monkeypatch, {"someone-else": 1})
    obj = tmp_path / "buckets" / "b" / "o"
    obj.write_bytes(b"x")

    async def run() -> list[int | str]:
        await broker.start()
        try:
            client = grants.BrokerClient(str(tmp_path / "fd.sock"))
            grant = grants.sign(broker.key, "someone-else", str(obj))
            return await client.open([(str(obj), grant)])
        finally:
            await broker.stop()

    assert asyncio.run(run()) == [f"uid {os.getuid()} runs no ETL of this cluster"]


def test_many_files_go_in_messages_of_at_most_fds_max(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "buckets" / "b").mkdir(parents=True, exist_ok=True)
    key = grants.grant_key(KEY, "t0")
    asks: list[tuple[str, str | None]] = []
    for i in range(grants.FDS_MAX + 7):
        f = tmp_path / "buckets" / "b" / f"o{i}"
        f.write_bytes(b"%d" % i)
        asks.append((str(f), grants.sign(key, "mine", str(f))))
    got, _ = asyncio.run(ask(tmp_path, monkeypatch, asks))
    assert [read_and_close(fd) for fd in got if isinstance(fd, int)] == [
        b"%d" % i for i in range(len(asks))
    ]


def test_without_the_variable_no_broker_runs_and_no_grant_is_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = broker_at(tmp_path, monkeypatch, {"mine": 0})
    monkeypatch.delenv(grants.ENV)

    async def run() -> None:
        await broker.start()
        await broker.stop()

    asyncio.run(run())
    assert broker.key is None and broker.target.forwarder.grant_key is None
    assert not (tmp_path / "fd.sock").exists()


def test_a_client_asks_a_restarted_broker_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = tmp_path / "buckets" / "b" / "o"

    async def run() -> list[bytes]:
        client = grants.BrokerClient(str(tmp_path / "fd.sock"))
        out = []
        for _ in range(2):  # the target restarted: its old connection is gone
            broker = broker_at(tmp_path, monkeypatch, {"mine": 0})
            obj.write_bytes(b"x")
            await broker.start()
            try:
                (fd,) = await client.open([(str(obj), grants.sign(broker.key, "mine", str(obj)))])
                assert isinstance(fd, int)
                out.append(read_and_close(fd))
            finally:
                await broker.stop()
        return out

    assert asyncio.run(run()) == [b"x", b"x"]
