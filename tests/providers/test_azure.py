"""``azure`` buckets end to end: Azurite behind a real ``sluice up`` (tests in remote_suite).

The cluster reaches Azurite through ``AZURE_STORAGE_ENDPOINT``,
``AZURE_STORAGE_ACCOUNT_NAME`` and ``AZURE_STORAGE_ACCOUNT_KEY`` (its
well-known account); the CLI spells the provider ``az://``, the SDK
``provider="az"`` (AIStore's alias), the aistore SDK ``Provider.AZURE``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest

from tests.providers.emulators import Azurite
from tests.providers.remote_suite import (  # noqa: F401  (collected here)
    get,
    new_bucket,
    refusing,
    test_401_403_404_503_name_the_bucket_and_the_backend,
    test_an_etl_and_a_view_on_cold_objects,
    test_cold_get_streams_one_fetch_for_ten_readers_then_warm,
    test_get_batch_of_remote_objects_cold_and_warm,
    test_listing_is_the_backends_with_a_cached_column_in_the_sdk_and_cli,
    test_prefetch_and_evict_jobs,
    test_put_writes_through_and_delete_deletes_both,
    test_seed_workflow_wds_shards_through_an_augmenting_etl_cold_then_warm,
    test_validate_warm_get_sees_a_changed_object,
)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``$SLUICE_SECRETS_DIR``: a secret ``wrong`` whose key Azurite rejects."""
    root = tmp_path_factory.mktemp("azure-secrets")
    (root / "wrong").mkdir()
    (root / "wrong" / "AZURE_STORAGE_ACCOUNT_KEY").write_text("bm90LXRoZS1rZXk=")
    (root / "empty").mkdir()
    return root


@pytest.fixture(scope="module")
def cluster(
    emu: Azurite, secrets_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    from etl_runtime.local.api import LocalCluster

    env = {**emu.env(), "SLUICE_SECRETS_DIR": str(secrets_dir)}
    with (
        mock.patch.dict(os.environ, env),
        LocalCluster(tmp_path_factory.mktemp("cluster"), targets=2, port=0) as c,
    ):
        yield str(c.endpoint).rstrip("/")


@pytest.fixture(scope="module")
def sdk_provider() -> str:
    return "az"


@pytest.fixture(scope="module")
def scheme() -> str:
    return "az"


def test_a_key_azure_rejects_is_a_401_and_props_are_checked(cluster: str, emu: Azurite) -> None:
    bucket = new_bucket(emu, {"o.txt": b"x"})
    url = f"{cluster}/v1/buckets/{bucket}"
    r = httpx.post(
        url, params={"provider": "az"}, json={"action": "create-bck", "props": {"secret": "wrong"}}
    )
    assert r.status_code == 401, r.text
    assert bucket in r.json()["error"] and "secret 'wrong'" in r.json()["error"]
    bad = [
        ({"account": "Not-An-Account"}, "not a storage account name"),
        ({"project": "p"}, "not props of azure buckets"),
        ({"secret": "empty"}, "holds neither"),
    ]
    for props, why in bad:
        body = {"action": "create-bck", "props": props}
        r = httpx.post(url, params={"provider": "azure"}, json=body)
        assert r.status_code == 400 and why in r.json()["error"], r.text
    r = get(cluster, emu, "Bad_Container", "x")
    assert r.status_code == 400, r.text
    # A good create, then its reads.
    r = httpx.post(url, params={"provider": "azure"}, json={"action": "create-bck", "props": {}})
    assert r.status_code == 200 and r.json()["props"]["provider"] == "azure", r.text
    assert get(cluster, emu, bucket, "o.txt").content == b"x"
