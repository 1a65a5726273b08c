"""The official ``aistore`` SDK's object props over a 3-target ``sluice up``.

``obj.head(props=...)`` answers the props asked, and only those, in
AIStore's headers (``ais-version``, ``ais-custom-md``, ...);
``set_custom_props()`` (``PATCH``) merges or replaces the user metadata and
keeps the bytes; the cluster map's ``uuid`` is not empty and every node
answers the same one.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from aistore.sdk import Client

from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("props") / "data", targets=3) as c:
        Client(c.endpoint).bucket("bkt-p").create()
        yield c


def test_head_answers_the_props_asked_and_only_those(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    obj = ais.bucket("bkt-p").object("o.txt")
    obj.get_writer().put_content(b"hello props")
    props = obj.head(props="size,version,checksum,atime")
    assert props.present and props.size == 11
    assert props.obj_version and props.checksum_type == "md5" and props.checksum_value
    assert int(props.access_time) > 0
    version = props.obj_version
    only = obj.head(props="version")
    assert only.obj_version == version and only.checksum_value == "" and only.size == 11
    assert only.custom_metadata == {} and only.access_time == ""
    obj.get_writer().put_content(b"changed")
    assert obj.head(props="version").obj_version != version  # a new write, a new version
    assert obj.head().size == 7  # the default: name, size
    r = httpx.head(f"{up.endpoint}/v1/objects/bkt-p/o.txt", params={"props": "size,colour"})
    assert r.status_code == 400  # a HEAD answer has no body to name it in


def test_set_custom_props_merges_or_replaces_and_keeps_the_bytes(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    obj = ais.bucket("bkt-p").object("m.bin")
    obj.get_writer().put_content(b"\x00bytes\xff" * 1000)
    obj.get_writer().set_custom_props({"owner": "ann", "stage": "raw"})
    obj.get_writer().set_custom_props({"stage": "clean"})
    assert obj.head(props="custom").custom_metadata == {"owner": "ann", "stage": "clean"}
    obj.get_writer().set_custom_props({"only": "this"}, replace_existing=True)
    assert obj.head(props="custom").custom_metadata == {"only": "this"}
    assert obj.get_reader().read_all() == b"\x00bytes\xff" * 1000
    url = f"{up.endpoint}/v1/objects/bkt-p/m.bin"
    r = httpx.patch(url, json={"action": "rename", "value": {"a": "b"}})
    assert r.status_code == 400 and "rename" in r.text
    r = httpx.patch(url, json={"action": "", "value": {"a": 1}})
    assert r.status_code == 400 and "string" in r.text
    r = httpx.patch(
        f"{up.endpoint}/v1/objects/bkt-p/none", json={"action": "", "value": {"a": "b"}}
    )
    assert r.status_code == 404 and "p/none" in r.text
    assert obj.head(props="custom").custom_metadata == {"only": "this"}


def test_the_cluster_map_has_a_uuid_every_node_shares(up: LocalCluster) -> None:
    smap = Client(up.endpoint).cluster().get_info()
    assert smap.uuid
    for node in smap.tmap.values():
        url = node.public_net.direct_url
        doc = httpx.get(f"{url}/v1/daemon", params={"what": "smap"}).json()
        assert doc["uuid"] == smap.uuid


def test_get_batch_by_kind_is_idle_so_its_wait_returns(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    ais.bucket("bkt-p").object("b1").get_writer().put_content(b"one")
    batch = ais.batch(["b1"], bucket=ais.bucket("bkt-p"))
    assert [data for _, data in batch.get()] == [b"one"]
    result = ais.job(job_kind="get-batch").wait(timeout=30, verbose=False)
    assert result.success, result
    assert ais.cluster().list_running_jobs(job_kind="get-batch") == []
