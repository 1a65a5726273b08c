"""What a GetBatch needs of the process that assembles it: ``BatchHost``.

Two processes assemble a GetBatch: the gateway, when it serves one itself,
and a storage target it designates (``storage_target/getbatch_routes.py``, AIStore's
"designated target"). Both give the assembler the same few things: the
cluster map, which targets are reachable and where, the headers its own calls
to targets carry, the owner to read one item from and, on a target, its own
share without a request to itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from etl_runtime.cluster.clustermap import ClusterMap, ClusterMapStore
from etl_runtime.cluster.records import TargetInfo

# A share asked of the host itself: the request's JSON (what ``POST /v1/_moss``
# would carry) -> an answer read as ``getbatch/exchange.py``'s ``ShareBody`` is.
LocalShare = Callable[[dict[str, Any]], Awaitable[Any]]


class BatchHost(Protocol):
    cmap: ClusterMapStore | None

    def alive_ids(self) -> set[str]: ...

    def suspect_ids(self) -> set[str]: ...

    def known_targets(self) -> list[TargetInfo]: ...

    def live_targets(self) -> list[TargetInfo]: ...

    def target_info(self, target_id: str, cmap: ClusterMap | None = None) -> TargetInfo | None: ...

    def target_headers(self) -> dict[str, str]: ...

    def read_owner(self, bucket: str, name: str) -> TargetInfo:
        """The target to GET ``bucket/name`` from (raises 404 bucket, 503 owner away)."""
        ...

    def local_share(self, target_id: str) -> LocalShare | None:
        """How to read a share of ``target_id`` in this process (it is this target:
        ``storage_target/getbatch_local.py``), or None: over HTTP."""
        ...
