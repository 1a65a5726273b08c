"""``KubeClusterMap`` on a real kube-apiserver: two stores, one ConfigMap.

Two stores stand for two gateway replicas (plus a target reading): each has
its own API client and watch, as separate processes would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from etl_runtime.cluster.clustermap import BucketProps, ClusterMap
from etl_runtime.cluster.kube.clustermap import DATA_KEY, KubeClusterMap
from etl_runtime.cluster.kube.config import api_client
from tests.k8s.fixtures import Cluster
from tests.k8s.waiting import wait_for

pytestmark = pytest.mark.k8s


@pytest.fixture
def stores(control_plane: Cluster, k8s_namespace: str) -> Iterator[list[KubeClusterMap]]:
    made = [KubeClusterMap(k8s_namespace, "map", api=api_client()) for _ in range(2)]
    for s in made:
        assert s.wait_synced(10)
    yield made
    for s in made:
        s.close()


def test_first_update_creates_the_configmap_and_every_store_sees_it(
    control_plane: Cluster, k8s_namespace: str, stores: list[KubeClusterMap]
) -> None:
    a, b = stores
    assert a.get() == ClusterMap()  # nothing there yet: the empty map, version 0
    new = a.update(lambda m: m.with_members(["t-0", "t-1"]).with_bucket("x", BucketProps(2)))
    assert (new.version, new.members) == (1, ("t-0", "t-1"))
    assert a.get() == new  # the writer serves its own write at once
    wait_for(lambda: b.get() == new, 10)  # the other one through its watch
    cm = control_plane.core.read_namespaced_config_map("map", k8s_namespace)
    assert ClusterMap.from_dict(json.loads(cm.data[DATA_KEY])) == new


def test_no_change_writes_nothing(stores: list[KubeClusterMap]) -> None:
    a, _ = stores
    first = a.update(lambda m: m.with_members(["t-0"]))
    assert a.update(lambda m: m.with_members(["t-0"])) == first
    assert a.get().version == 1


def test_racing_writers_lose_no_bucket_and_bump_once_for_the_same_change(
    stores: list[KubeClusterMap],
) -> None:
    a, b = stores
    a.update(lambda m: m.with_members(["t-0", "t-1"]))
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(store: KubeClusterMap, prefix: str) -> None:
        try:
            start.wait()
            for i in range(8):
                store.update(lambda m, i=i: m.with_bucket(f"{prefix}{i}", BucketProps()))
                # Both saw the StatefulSet go to 3: the same change, from both sides.
                store.update(lambda m: m.with_members(["t-0", "t-1", "t-2"]))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(s, p)) for s, p in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    final = a.update(lambda m: m)
    assert sorted(final.buckets) == sorted(
        [f"a{i}" for i in range(8)] + [f"b{i}" for i in range(8)]
    )
    assert final.members == ("t-0", "t-1", "t-2")
    assert final.rebalance_id == 1  # one membership change, one rebalance
    assert final.previous == ("t-0", "t-1")
    # 1 (create) + 16 buckets + 1 membership change: no write was lost or doubled.
    assert final.version == 18
    wait_for(lambda: b.get() == final, 10)


def test_a_stale_watch_event_never_moves_the_map_back(stores: list[KubeClusterMap]) -> None:
    a, _ = stores
    a.update(lambda m: m.with_members(["t-0"]))
    newer = a.update(lambda m: m.with_bucket("x", BucketProps()))
    a._seen({"map": {"data": {DATA_KEY: json.dumps(ClusterMap(version=1).to_dict())}}})
    assert a.get() == newer


def test_a_target_told_of_a_new_bucket_reads_past_its_lagging_watch(
    control_plane: Cluster, k8s_namespace: str, stores: list[KubeClusterMap], tmp_path
) -> None:
    """The gateway writes a bucket into the map, then tells every live target
    (create-bck); a target whose watch has not delivered that write yet (here: a store
    with no watch at all, the extreme of a watch lagging under load) must know the
    bucket before it answers, or the first PUT after an acknowledged create is a 404."""
    from etl_runtime.storage.copies import Placement
    from etl_runtime.storage.store import ObjectStore

    gateway, _ = stores
    gateway.update(lambda m: m.with_members(["t-0"]).with_bucket("old", BucketProps(1)))
    lagging = KubeClusterMap(k8s_namespace, "map", api=api_client(), start=False)
    lagging.refresh()
    placement = Placement("t-0", ObjectStore(tmp_path), lagging, None)
    assert placement.bucket_known("old") is True
    gateway.update(lambda m: m.with_bucket("fresh", BucketProps(2)))
    assert placement.bucket_known("fresh") is False  # the stale map: a PUT would 404
    assert placement.learn_bucket("fresh", timeout=10) is True
    assert lagging.get().buckets["fresh"] == BucketProps(2)
    assert placement.learn_bucket("never-made", timeout=0.3) is False  # bounded, no hang
