"""A wds shard relayed by a target, alone or in a pipeline, breaking after sample 60.

The target relays the transformer's answer (the hpush ``PUT``; ``?etl_name=``
without the 307, and every ``etl_pipeline``). When the transformer's stream
breaks, the client must get a tar that no reader takes for a whole shard: the
transformer's error member passes through, or, where the target's copy of the
stream ends on a member boundary (the transformer's reset can cost the target
the tail of the answer), ``TarCursor`` adds one. Each on asyncio and uvloop,
read with the real ``webdataset`` library and with ``tarfile``.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator

import httpx
import pytest

from tests.servers import SessionServers
from tests.storage_target.conftest import RunningTarget
from tests.storage_target.fakes import record
from tests.webserver.conftest import loop_transformer, tar_members, text_shard
from tests.webserver.test_wds_midstream import (
    FAIL_AT,
    FAILURES,
    shard,
    tarfile_members,
    webdataset_read,
)

READS = 10


@pytest.fixture
def relay(
    target_on_loop: RunningTarget, session_servers: SessionServers, loop_name: str
) -> Iterator[RunningTarget]:
    target = target_on_loop
    url = loop_transformer(session_servers, "wds", loop_name)
    for name in ("first", "second"):  # a pipeline may name the same transformer twice
        target.registry.put(record(name, {"t0": url}, mode="wds"))
    target.client.post("/v1/buckets/bkt", json={"action": "create-bck"})
    for failing in FAILURES:
        assert target.client.put(
            f"/v1/objects/bkt/{failing}.tar", content=shard(failing)
        ).is_success
    yield target


# What the first ETL's failure is when a pipeline answers it before its first byte
EARLY = {
    "poison": (422, "TransformError"),
    "exit": (503, "WorkerDied"),
    "badresult": (422, "BadResult"),
}


def received(url: str, failing: str) -> bytes | None:
    """The bytes that arrive before the break; None for an error answered instead.

    A pipeline's first ETL may break before the second step answered: then the
    answer is the first ETL's error (its status, naming it and the sample),
    never the second's "did not answer, retry shortly".
    """
    got = bytearray()
    with httpx.stream("GET", url, timeout=60) as r:
        if r.status_code != 200:
            body = json.loads(r.read())
            assert "pipeline" in url, body
            assert (r.status_code, body["kind"]) == EARLY[failing], body
            assert body["etl"] == "first" and body["sample"] == failing, body
            assert FAILURES[failing] in body["error"], body
            assert ("retry-after" in r.headers) == (r.status_code == 503)
            return None
        with pytest.raises(httpx.RemoteProtocolError):
            for chunk in r.iter_raw():
                got += chunk
    return bytes(got)


QUERIES = {"single": "etl_name=first", "pipeline": "etl_name=first&etl_pipeline=second"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("chain", list(QUERIES))
@pytest.mark.parametrize("failing", list(FAILURES))
def test_relayed_break_is_never_a_short_shard(
    relay: RunningTarget, failing: str, chain: str
) -> None:
    url = f"{relay.url}/v1/objects/bkt/{failing}.tar?{QUERIES[chain]}"
    outcomes = [webdataset_read(url) for _ in range(READS)]
    silent = [n for error, n in outcomes if error is None]
    assert silent == [], f"{len(silent)} of {READS} reads ended quietly with {silent} samples"
    if (got := received(url, failing)) is None:
        return
    names, error = tarfile_members(got)
    assert isinstance(error, tarfile.ReadError), names[-3:]
    assert len(names) <= FAIL_AT + 1
    assert names[:-1] == [f"s{i:04d}.txt" for i in range(len(names) - 1)]
    # the last member read: an error member (the transformer's, or the target's own
    # when it lost the tail of the answer), or a sample cut short
    assert names[-1].startswith("__sluice_error__/") or names[-1] == f"s{len(names) - 1:04d}.txt"


def test_whole_shards_relay_unchanged(relay: RunningTarget) -> None:
    keys = [f"s{i:04d}" for i in range(300)]
    relay.client.put("/v1/objects/bkt/whole.tar", content=text_shard(keys, 3_001))
    want = [(f"{k}.txt", k.upper().encode().ljust(3_001, b".")) for k in keys]
    for query in QUERIES.values():
        r = relay.client.get(f"/v1/objects/bkt/whole.tar?{query}")
        assert r.status_code == 200, r.text
        assert tar_members(r.content) == want
