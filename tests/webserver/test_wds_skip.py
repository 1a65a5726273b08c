"""``etl_skip=K`` on a wds transformer's hpush PUT: the first K samples left out untransformed.

The target sends it when a loader resumes inside a shard (``etl/forward.py``);
here the transformers are the session's event-loop ones (asyncio and uvloop),
fed the shard as a body and as a file (``etl_fqn``).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.servers import SessionServers
from tests.webserver.conftest import loop_transformer, tar_members, text_shard

KEYS = [f"k/{i:03d}" for i in range(12)]


def upper(keys: list[str]) -> list[tuple[str, bytes]]:
    return [(f"{k}.txt", k.upper().encode().ljust(20_000, b".")) for k in keys]


@pytest.fixture(scope="module")
def urls(session_servers: SessionServers, loop_name: str) -> tuple[str, str]:
    return (
        loop_transformer(session_servers, "wds", loop_name),
        loop_transformer(session_servers, "object", loop_name),
    )


def samples_done(url: str) -> int:
    return int(httpx.get(f"{url}/stats").json()["samples"])


def test_skipped_samples_are_neither_sent_nor_transformed(urls, tmp_path: Path) -> None:
    wds = urls[0]
    shard = text_shard(KEYS)
    before = samples_done(wds)
    r = httpx.put(f"{wds}/b/s.tar", content=shard, params={"etl_skip": "9"}, timeout=30)
    assert r.status_code == 200, r.text
    assert tar_members(r.content) == upper(KEYS[9:])
    assert r.headers["x-sluice-etl-skipped"] == "9"
    assert r.headers["x-sluice-etl-skipped-key"] == "k%2F008"  # the last one left out
    assert samples_done(wds) - before == 3

    path = tmp_path / "s.tar"  # the transformer reads the file itself
    path.write_bytes(shard)
    r = httpx.put(f"{wds}/b/s.tar", params={"etl_fqn": str(path), "etl_skip": "11"}, timeout=30)
    assert r.status_code == 200 and tar_members(r.content) == upper(KEYS[11:])
    # Past the end: an empty shard, and the header says how many there were.
    r = httpx.put(f"{wds}/b/s.tar", params={"etl_fqn": str(path), "etl_skip": "40"}, timeout=30)
    assert r.status_code == 200 and tar_members(r.content) == []
    assert r.headers["x-sluice-etl-skipped"] == "12"
    assert samples_done(wds) - before == 4


@pytest.mark.parametrize(
    ("which", "params", "says"),
    [
        (0, [("etl_skip", "1e3")], "etl_skip='1e3' is not a count"),
        (0, [("etl_skip", "1"), ("etl_skip", "1")], "'etl_skip' given 2 times"),
        (1, [("etl_skip", "2")], "in object mode; only a wds ETL skips samples"),
    ],
)
def test_a_bad_etl_skip_is_a_400(urls, which: int, params, says: str) -> None:
    r = httpx.put(f"{urls[which]}/b/s.tar", content=text_shard(KEYS[:2]), params=params)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]
