"""Bucket calls of the official ``aistore`` SDK over a 3-target ``sluice up``:
``bucket.summary()`` and ``bucket.info()`` (AIStore's two-step summary)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from aistore.sdk import Client
from aistore.sdk.errors import AISError

from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("aisbck") / "data", targets=3) as c:
        bck = Client(c.endpoint).bucket("sized")
        bck.create(exist_ok=True)
        for i, size in enumerate((10, 20, 30, 40)):
            bck.object(f"{'a' if i < 3 else 'b'}/{i}").get_writer().put_content(b"x" * size)
        yield str(c.endpoint)


def test_summary_counts_objects_and_bytes(up: str) -> None:
    bck = Client(up).bucket("sized")
    summ = bck.summary()
    assert summ["ObjCount"]["obj_count_present"] == "4"
    assert summ["TotalSize"]["size_all_present_objs"] == "100"
    assert summ["ObjSize"] == {"obj_min_size": 10, "obj_max_size": 40, "obj_avg_size": 25}
    assert bck.summary(prefix="a/")["ObjCount"]["obj_count_present"] == "3"
    with pytest.raises(AISError) as err:
        Client(up).bucket("nowhere").summary()
    assert err.value.status_code == 404


def test_info_gives_props_and_summary(up: str) -> None:
    props, summ = Client(up).bucket("sized").info()
    assert '"copies": 1' in props
    assert summ["ObjCount"]["obj_count_present"] == "4"
    r = httpx.head(f"{up}/v1/buckets/sized", params={"presence": "0", "odd": "1"})
    assert r.status_code == 400


def test_a_summary_with_an_unknown_field_is_a_400_naming_it(up: str) -> None:
    body = {"action": "summary-bck", "value": {"uuid": "", "wide": True}}
    r = httpx.request("GET", f"{up}/v1/buckets/sized", json=body)
    assert r.status_code == 400 and "wide" in r.json()["error"], r.text
