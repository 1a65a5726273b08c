"""Each server's OpenAPI names every operation once (the spec schemathesis fuzzes).

An endpoint registered for several methods with ``api_route`` gave all its
operations one ``operationId``: FastAPI warned "Duplicate Operation ID" for
the gateway's object routes, its S3 routes and the target's
``/v1/objects/{bucket}``, and a tool that keys on the id saw one operation.
"""

from __future__ import annotations

import collections
import warnings
from pathlib import Path
from typing import Any

from etl_runtime.gateway import create_gateway_app
from etl_runtime.storage_target import create_target_app
from tests.gateway.conftest import DictBackend, StaticDiscovery
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry


def operation_ids(app: Any) -> tuple[list[str], list[str]]:
    """Every operationId of ``app``'s spec, and the warnings building it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = app.openapi()
    ids = [
        op["operationId"]
        for path in spec["paths"].values()
        for op in path.values()
        if isinstance(op, dict) and "operationId" in op
    ]
    return ids, [str(w.message) for w in caught]


def test_every_operation_id_is_unique_on_the_gateway_and_a_target(tmp_path: Path) -> None:
    registry = DictRegistry()
    apps = {
        "gateway": create_gateway_app(
            StaticDiscovery([]), DictBackend(registry), cluster_key=CLUSTER_KEY
        ),
        "target": create_target_app("t0", tmp_path / "t0", registry, cluster_key=CLUSTER_KEY),
    }
    for server, app in apps.items():
        ids, said = operation_ids(app)
        twice = [i for i, n in collections.Counter(ids).items() if n > 1]
        assert not twice, f"{server}: operationIds used more than once: {twice}"
        assert not [w for w in said if "Duplicate Operation ID" in w], (server, said)
        assert len(ids) > 10, (server, ids)
    gateway_ids, _ = operation_ids(apps["gateway"])  # one operation per method, each named
    objects = [i for i in gateway_ids if i.startswith("object_call_v1_objects")]
    assert len(objects) == 6, objects
