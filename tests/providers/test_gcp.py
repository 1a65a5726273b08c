"""``gcp`` buckets end to end: fake-gcs-server behind a real ``sluice up`` (tests in remote_suite).

The cluster reaches the emulator the way Google's clients do, through
``STORAGE_EMULATOR_HOST``; the CLI spells the provider ``gs://``, the SDK
``provider="gs"`` (AIStore's alias), the aistore SDK ``Provider.GOOGLE``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest

from tests.providers.cutproxy import CutProxy
from tests.providers.emulators import FakeGcs
from tests.providers.remote_suite import (  # noqa: F401  (collected here)
    get,
    new_bucket,
    refusing,
    sluice,
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
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    server = FakeGcs(tmp_path_factory.mktemp("fake-gcs") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gcp-secrets")
    (root / "notakey").mkdir()
    (root / "notakey" / "GOOGLE_SERVICE_ACCOUNT_KEY").write_text('{"type": "service_account"}')
    return root


@pytest.fixture(scope="module")
def cluster(
    emu: FakeGcs, secrets_dir: Path, tmp_path_factory: pytest.TempPathFactory
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
    return "gs"


@pytest.fixture(scope="module")
def scheme() -> str:
    return "gs"


def test_gcp_props_are_checked_by_the_gcp_provider(cluster: str, emu: FakeGcs) -> None:
    url = f"{cluster}/v1/buckets/rb-gcp-props"
    emu.create_bucket("rb-gcp-props")
    bad = [
        ({"project": "Not_A_Project"}, "not a GCP project id"),
        ({"region": "us-east-1"}, "not props of gcp buckets"),
        ({"secret": "notakey"}, "holds no service account key"),
        ({"endpoint": "ftp://x"}, "must be an http(s):// URL"),
    ]
    for props, why in bad:
        r = httpx.post(
            url, params={"provider": "gs"}, json={"action": "create-bck", "props": props}
        )
        assert r.status_code == 400 and why in r.json()["error"], r.text
    # The CLI's props command, by AIStore's alias gs://.
    made = sluice(cluster, "props", "gs://rb-gcp-props", "--create", "--project", "sluice-test")
    assert made.returncode == 0, made.stderr
    props = json.loads(made.stdout)
    assert props["provider"] == "gcp" and props["backend"] == {"project": "sluice-test"}


def test_a_big_write_through_put_is_a_resumable_upload_in_chunks(
    cluster: str, emu: FakeGcs
) -> None:
    from etl_runtime.providers.gcp import RESUMABLE_ABOVE, RESUMABLE_CHUNK

    proxy = CutProxy(emu.endpoint)  # in front of the emulator: it records each request
    try:
        bucket = new_bucket(emu, {})
        r = httpx.post(
            f"{cluster}/v1/buckets/{bucket}",
            params={"provider": "gcp"},
            json={"action": "create-bck", "props": {"endpoint": proxy.endpoint}},
        )
        assert r.status_code == 200, r.text
        big = os.urandom(RESUMABLE_ABOVE + RESUMABLE_CHUNK + (3 << 20))  # three requests
        small = os.urandom(1 << 20)
        for name, data in (("big.bin", big), ("small.bin", small)):
            put = httpx.put(
                f"{cluster}/v1/objects/{bucket}/{name}",
                params={"provider": "gcp"},
                content=data,
                follow_redirects=True,
                timeout=120,
            )
            assert put.status_code == 200, put.text
        uploads = [(m, p) for m, p in proxy.requests if p.startswith("/upload/")]
    finally:
        proxy.close()
    sessions = [p for m, p in uploads if m == "POST" and "uploadType=resumable" in p]
    chunks = [p for m, p in uploads if m == "PUT" and "upload_id=" in p]
    media = [p for m, p in uploads if m == "POST" and "uploadType=media" in p]
    assert len(sessions) == 1 and "name=big.bin" in sessions[0]
    assert len(chunks) == 3  # 8 MiB, 8 MiB, 3 MiB
    assert len(media) == 1 and "name=small.bin" in media[0]  # a small body: one request
    # On the backend as the official client reads it, and the cached copy carries its ETag.
    assert emu.read(bucket, "big.bin") == big and emu.read(bucket, "small.bin") == small
    got = get(cluster, emu, bucket, "big.bin")
    assert got.status_code == 200 and got.content == big
    blob = emu.client().bucket(bucket).get_blob("big.bin")
    assert blob is not None and blob.size == len(big)
    assert got.headers["etag"].strip('"') == blob.etag.strip('"')
