"""Cluster state as the data plane sees it, independent of where it comes from.

Targets ask an ``EtlRegistry`` "where is my transformer for ETL X?". The gateway
asks a ``TargetDiscovery`` "which targets are live?" and drives an
``EtlBackend`` for the ``/v1/etl`` API. Two families implement these:

* local (``etl_runtime.local``): JSON files under the data dir, transformers as
  child processes of the gateway;
* Kubernetes (``etl_runtime.cluster.kube``): ETL custom resources and target pods,
  with the kopf operator doing the actuation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from etl_runtime.core.spec import EtlSpec

PHASES = ("Initializing", "Running", "Stopped", "Error")


@dataclass(frozen=True)
class TargetInfo:
    """A storage target: stable id (pod name / ``t0``), base URL, node."""

    id: str
    url: str
    node: str | None = None


@dataclass(frozen=True)
class TransformerStatus:
    """One transformer of an ETL, beside one target."""

    target: str
    endpoint: str | None
    ready: bool
    pod: str | None = None
    node: str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "endpoint": self.endpoint,
            "ready": self.ready,
            "pod": self.pod,
            "node": self.node,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TransformerStatus:
        return cls(
            target=d["target"],
            endpoint=d.get("endpoint"),
            ready=bool(d.get("ready")),
            pod=d.get("pod"),
            node=d.get("node"),
            message=d.get("message"),
        )


@dataclass(frozen=True)
class EtlRecord:
    """An ETL as registered: spec plus observed status."""

    name: str
    uid: str
    spec: EtlSpec
    phase: str = "Initializing"
    message: str | None = None
    transformers: tuple[TransformerStatus, ...] = field(default_factory=tuple)

    def transformer_for(self, target_id: str) -> TransformerStatus | None:
        for t in self.transformers:
            if t.target == target_id:
                return t
        return None

    @property
    def ready_count(self) -> int:
        return sum(1 for t in self.transformers if t.ready)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "uid": self.uid,
            "spec": self.spec.to_dict(),
            "phase": self.phase,
            "message": self.message,
            "transformers": [t.to_dict() for t in self.transformers],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EtlRecord:
        return cls(
            name=d["name"],
            uid=d["uid"],
            spec=EtlSpec.from_dict(d["spec"]),
            phase=d.get("phase", "Initializing"),
            message=d.get("message"),
            transformers=tuple(TransformerStatus.from_dict(t) for t in d.get("transformers", [])),
        )


class EtlRegistry(Protocol):
    """Read side used by targets (must be cheap: called per request)."""

    def get(self, name: str) -> EtlRecord | None: ...


class TargetDiscovery(Protocol):
    """Live targets, used by the gateway for HRW and fan-out."""

    def targets(self) -> list[TargetInfo]: ...


class EtlBackend(Protocol):
    """Write side behind the gateway's ``/v1/etl`` API."""

    async def init(self, name: str, spec: EtlSpec) -> EtlRecord:
        """Create the ETL, or replace its spec if it exists (new uid not required)."""
        ...

    async def list(self) -> list[EtlRecord]: ...

    async def get(self, name: str) -> EtlRecord | None: ...

    async def set_stopped(self, name: str, stopped: bool) -> EtlRecord:
        """Raise ``KeyError(name)`` if there is no such ETL."""
        ...

    async def delete(self, name: str) -> None:
        """Raise ``KeyError(name)`` if there is no such ETL."""
        ...
