"""The cluster map in AIStore's ``Smap`` shape, as the official ``aistore`` SDK (2.0.x) reads it.

``{"tmap": {id: Snode}, "pmap": {id: Snode}, "proxy_si": Snode, "version",
"uuid", "creation_time"}``, an ``Snode`` being ``{"daemon_id", "daemon_type"
("target" | "proxy"), "public_net", "intra_control_net", "intra_data_net"
({"node_hostname", "node_ip_addr", "daemon_port", "direct_url"}), "flags",
"id_digest"}``. Sluice targets have one address, so the three nets are the
same; ``version`` is the cluster map's, a string as AIStore sends it;
``uuid`` a digest of the member targets' ids (``cluster_uuid``).

The gateway answers it (``gateway/smap.py``: liveness as flags, its own URL
as the primary), and so does every target (``storage_target/app.py``: from its
copy of the map; it does not know the gateway's address, so its ``proxy_si``
has none): the SDK asks the target it read from again after a 404.

``id_digest`` is a 64-bit digest of the daemon id. The SDK places a direct
read itself with AIStore's HRW (xxhash over ``id_digest``), which is not
Sluice's (``clustermap.hrw_order``); a target that gets a read it does not
own redirects it to the owner (``storage.copies.Placement.read_owner``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

GATEWAY_ID = "gateway"
SNODE_MAINT = 1 << 2  # AIStore's meta.SnodeMaint: the SDK places nothing there


def id_digest(daemon_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(daemon_id.encode(), digest_size=8).digest(), "big")


def _net(url: str) -> dict[str, str]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = str(parts.port or (443 if parts.scheme == "https" else 80))
    return {"node_hostname": host, "node_ip_addr": host, "daemon_port": port, "direct_url": url}


def snode(daemon_id: str, daemon_type: str, url: str | None, flags: int = 0) -> dict[str, Any]:
    """One node; ``url`` None: its address is not known here (no nets)."""
    net = _net(url.rstrip("/")) if url else None
    return {
        "daemon_id": daemon_id,
        "daemon_type": daemon_type,
        "public_net": net,
        "intra_control_net": net,
        "intra_data_net": net,
        "flags": flags,
        "id_digest": id_digest(daemon_id),
    }


def cluster_uuid(target_ids: Iterable[str]) -> str:
    """The ``uuid`` the SDK shows: a digest of the member targets' ids (the gateway and
    every target answer the same; a member joining or leaving makes a new one)."""
    joined = ",".join(sorted(target_ids))
    return hashlib.blake2b(f"sluice-cluster:{joined}".encode(), digest_size=8).hexdigest()


def smap_doc(
    targets: Iterable[tuple[str, str, int]], gateway_url: str | None, version: int
) -> dict[str, Any]:
    """An ``Smap`` of ``targets`` (id, URL, flags) with the gateway as the primary proxy."""
    proxy = snode(GATEWAY_ID, "proxy", gateway_url)
    tmap = {tid: snode(tid, "target", url, flags) for tid, url, flags in targets}
    return {
        "tmap": tmap,
        "pmap": {GATEWAY_ID: proxy},
        "proxy_si": proxy,
        "version": str(version),
        "uuid": cluster_uuid(tmap),
        "creation_time": "",
    }
