"""A mid-shard resume through a wds ETL: the target leaves the read samples out untransformed.

``ShardReader`` resumed inside a shard asks for it with ``etl_skip=K``; the
transformer groups the first ``K`` samples and drops them without running the
user function. Its ``samples`` counter (``GET /v1/etl/NAME``, all targets)
says how many it transformed.
"""

from __future__ import annotations

from itertools import islice

import httpx
import pytest

from etl_runtime.pytorch import DatasetError, ShardReader
from tests.pytorch.conftest import make_shard, sample_key

pytestmark = pytest.mark.torch

SAMPLES = 20


@pytest.fixture(scope="module")
def cached_etl(client) -> str:
    """A wds ETL whose answers the targets keep (``cache: true``; started by conftest)."""
    client.etl("pt-tag-cached").wait_until_running(120)
    return "pt-tag-cached"


@pytest.fixture(scope="module")
def bucket(client):
    bucket = client.bucket("pt-skip").create()
    bucket.object("big.tar").put_content(make_shard(7, samples=SAMPLES, pad=5_000))
    return bucket


def transformed(client, etl: str) -> int:
    """Samples the ETL's transformers have run the user function on, all targets."""
    return int(client.etl(etl).details().stats["samples"])


def test_a_resume_at_the_last_samples_transforms_only_those(client, bucket, etls) -> None:
    etl = etls[1]  # pt-tag: a per-sample (wds) ETL
    reader = ShardReader(bucket, etl_name=etl)
    first = [key for key, _ in islice(iter(reader), SAMPLES - 2)]
    state = reader.state_dict()

    before = transformed(client, etl)
    again = ShardReader(bucket, etl_name=etl)
    again.load_state_dict(state)
    rest = list(again)
    assert first + [k for k, _ in rest] == [sample_key(7, i) for i in range(SAMPLES)]
    assert all(f["tag"] == f"tagged {k}".encode() for k, f in rest)  # through the ETL
    assert transformed(client, etl) - before == 2  # not the 18 read before the save

    # The shard rewritten since: sample 18 is not the one the position names.
    bucket.object("big.tar").put_content(make_shard(6, samples=SAMPLES))
    changed = ShardReader(bucket, etl_name=etl)
    changed.load_state_dict(state)
    with pytest.raises(DatasetError, match="pt-skip/big.tar' changed since"):
        list(changed)
    bucket.object("big.tar").put_content(make_shard(7, samples=SAMPLES, pad=5_000))


def test_a_view_through_a_wds_etl_resumes_the_same_way(client, bucket, etls) -> None:
    view = client.bucket("pt-skip-tagged").create(view_of=bucket.name, etl=etls[1])
    reader = ShardReader(view)  # no etl_name: the view names its ETL
    first = [key for key, _ in islice(iter(reader), SAMPLES - 2)]
    state = reader.state_dict()
    before = transformed(client, etls[1])
    again = ShardReader(view)
    again.load_state_dict(state)
    rest = list(again)
    assert first + [k for k, _ in rest] == [sample_key(7, i) for i in range(SAMPLES)]
    assert all(f["tag"] == f"tagged {k}".encode() for k, f in rest)
    assert transformed(client, etls[1]) - before == 2


def test_a_skip_is_never_kept_as_the_cached_shard(client, bucket, cached_etl) -> None:
    reader = ShardReader(bucket)  # the position of 3 samples read, saved without the ETL
    head = [key for key, _ in islice(iter(reader), 3)]
    state = reader.state_dict()
    # Resumed first, on a cold cache: the answer without 3 samples is not kept...
    again = ShardReader(bucket, etl_name=cached_etl)
    again.load_state_dict(state)
    assert head + [k for k, _ in again] == [sample_key(7, i) for i in range(SAMPLES)]
    # ...so whole reads (the first kept, the second a hit) have every sample.
    for _ in range(2):
        whole = [(k, f["tag"]) for k, f in ShardReader(bucket, etl_name=cached_etl)]
        assert whole == [
            (sample_key(7, i), f"tagged {sample_key(7, i)}".encode()) for i in range(20)
        ]
    before = transformed(client, cached_etl)
    resumed = ShardReader(bucket, etl_name=cached_etl)
    resumed.load_state_dict(state)
    assert [k for k, _ in resumed] == [sample_key(7, i) for i in range(3, SAMPLES)]
    assert transformed(client, cached_etl) - before == SAMPLES - 3  # the skip misses the cache


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("etl_name=pt-tag&etl_skip=two", "etl_skip='two' is not a count"),
        ("etl_name=pt-tag&etl_skip=-1", "etl_skip='-1' is not a count"),
        ("etl_name=pt-tag&etl_skip=1&etl_skip=2", "'etl_skip' given 2 times"),
        ("etl_skip=3", "etl_skip=3 needs etl_name"),
        ("etl_name=pt-upper&etl_skip=3", "ETL 'pt-upper' is not a wds ETL"),
        (
            "etl_name=pt-tag&etl_pipeline=pt-tag&etl_skip=3",
            "etl_skip does not go with etl_pipeline",
        ),
    ],
)
def test_a_bad_etl_skip_is_a_400_naming_it(endpoint, bucket, etls, query, says) -> None:
    r = httpx.get(f"{endpoint}/v1/objects/pt-skip/big.tar?{query}", follow_redirects=True)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]
