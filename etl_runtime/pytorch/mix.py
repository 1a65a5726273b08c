"""``Mix``: several datasets interleaved by weight, deterministic and resumable.

::

    mix = Mix({ShardReader(web): 0.7, ObjectIterDataset(Source(books, prefix="en/")): 0.3},
              seed=1, stop="shortest")
    loader = StatefulDataLoader(mix, batch_size=None, num_workers=4)

The picks follow smooth weighted round-robin (each source earns its weight
per pick, the richest is picked and pays 1), so after ``n`` picks each source
has been picked ``w * n`` times to within one; the picks of each block of
``BLOCK`` are then shuffled with ``(seed, epoch, rank, worker, phase, block)``,
so the realised shares stay within ``BLOCK / n`` of the weights at every
point and exactly so at block ends. Each DataLoader worker mixes its own
share of every source (the sources split themselves across ranks and
workers), so nothing is read twice.

``stop``: ``"shortest"`` ends the epoch when a source runs out;
``"longest"`` drops a source that runs out and mixes the others by their
weights until all are out; ``"never"`` starts a source that runs out on its
next epoch (``set_epoch(epoch + 1)``), an endless stream.

``state_dict()`` holds the mixer's counters and every source's position;
``load_state_dict`` of the same layout goes on exactly, and
``Mix.merge_positions`` joins the states of every worker of every rank for
another layout (each source resumes exactly; the picks start a new block).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from torch.utils.data import IterableDataset

from etl_runtime.pytorch.errors import DatasetError
from etl_runtime.pytorch.position import Position, merge_positions
from etl_runtime.pytorch.split import current_part

Stop = Literal["shortest", "longest", "never"]
BLOCK = 64
_END = object()


class Mix(IterableDataset[Any]):
    """Samples of several iterable datasets, mixed by weight (see the module docstring)."""

    def __init__(
        self,
        sources: Mapping[Any, float] | Sequence[tuple[Any, float]],
        *,
        seed: int = 0,
        stop: Stop = "shortest",
    ) -> None:
        pairs = list(sources.items()) if isinstance(sources, Mapping) else list(sources)
        if not pairs:
            raise ValueError("Mix needs at least one source")
        if stop not in ("shortest", "longest", "never"):
            raise ValueError(f"stop must be 'shortest', 'longest' or 'never', not {stop!r}")
        weights = [float(w) for _, w in pairs]
        if any(not w > 0 for w in weights):
            raise ValueError(f"weights must be positive, got {weights}")
        self.sources = [s for s, _ in pairs]
        self.weights = np.asarray(weights) / sum(weights)
        self.seed, self.stop, self.epoch = seed, stop, 0
        self._start: dict[str, Any] = self._fresh()
        self._live: dict[str, Any] | None = None

    def _fresh(self, active: Sequence[bool] | None = None) -> dict[str, Any]:
        active = list(active) if active is not None else [True] * len(self.sources)
        return {"phase": 0, "picks": 0, "credits": [0.0] * len(self.sources), "active": active}

    def set_epoch(self, epoch: int) -> None:
        """Every source reads epoch ``epoch``; the mixer starts again."""
        self.epoch = epoch
        for source in self.sources:
            if hasattr(source, "set_epoch"):
                source.set_epoch(epoch)
        self._start, self._live = self._fresh(), None

    def state_dict(self) -> dict[str, Any]:
        counters = self._live if self._live is not None else self._start
        counters = {k: v for k, v in counters.items() if k != "next_credits"}
        return {
            "mix": {**counters, "credits": list(counters["credits"]), "epoch": self.epoch},
            "sources": [self._source_state(s) for s in self.sources],
        }

    def _source_state(self, source: Any) -> dict[str, Any]:
        if not hasattr(source, "state_dict"):
            raise DatasetError(f"Mix: source {type(source).__name__} has no state_dict()")
        return dict(source.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A state of this mix (same layout), or ``Mix.merge_positions``' (any layout)."""
        try:
            counters, sources = dict(state["mix"]), list(state["sources"])
        except (KeyError, TypeError) as exc:
            raise DatasetError(f"not a Mix position: {type(exc).__name__}: {exc}") from exc
        if len(sources) != len(self.sources):
            raise DatasetError(
                f"this Mix position has {len(sources)} sources; the mix has {len(self.sources)}"
            )
        for source, s in zip(self.sources, sources, strict=True):
            source.load_state_dict(s)
        self.epoch = int(counters.pop("epoch", self.epoch))
        if self.stop == "never":  # a source read to its end goes on with its next epoch
            counters["active"] = [True] * len(self.sources)
        self._start, self._live = counters, None

    @staticmethod
    def merge_positions(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """One Mix position out of the states of every worker of every rank."""
        mixes: list[Mapping[str, Any]] = []
        for state in states:
            if "_snapshot" in state:
                snap = state["_snapshot"]
                workers = snap.get("_worker_snapshots") or {}
                mixes += [w["dataset_state"] for w in workers.values()] or [
                    snap["_main_snapshot"]["dataset_state"]
                ]
            elif "dataset_state" in state:
                mixes.append(state["dataset_state"])
            else:
                mixes.append(state)
        if not mixes or any("mix" not in m for m in mixes):
            raise DatasetError("Mix.merge_positions: give the states of a Mix's loaders")
        n = len(mixes[0]["sources"])
        merged = [merge_positions([m["sources"][i] for m in mixes]) for i in range(n)]
        # A source some reader ran out of under "longest" stays out only if it is all read.
        active = [not Position.from_state(m).complete() for m in merged]
        epoch = max(int(m["mix"].get("epoch", 0)) for m in mixes)
        counters = {"phase": 0, "picks": 0, "credits": [0.0] * n, "active": active}
        return {"mix": {**counters, "epoch": epoch}, "sources": merged}

    def _order(self, counters: dict[str, Any], block: int) -> np.ndarray:
        """The picks of one block: smooth weighted round-robin, shuffled within the block."""
        active = np.asarray(counters["active"], dtype=bool)
        weights = np.where(active, self.weights, 0.0)
        weights = weights / weights.sum()
        credits = np.asarray(counters["credits"], dtype=float)
        picks = np.empty(BLOCK, dtype=np.int64)
        for i in range(BLOCK):
            credits += weights
            pick = int(np.argmax(np.where(active, credits, -np.inf)))
            credits[pick] -= 1.0
            picks[i] = pick
        counters["next_credits"] = credits.tolist()
        part = current_part()
        key = (self.seed, self.epoch, part.rank, part.worker, counters["phase"], block)
        return np.random.default_rng(key).permutation(picks)

    def __iter__(self) -> Iterator[Any]:
        live = {**self._start, "credits": list(self._start["credits"])}
        live["active"] = list(live["active"])
        self._live = live
        if self.stop == "shortest" and not all(live["active"]):
            return
        iters: list[Iterator[Any] | None] = [
            iter(s) if a else None for s, a in zip(self.sources, live["active"], strict=True)
        ]
        while any(live["active"]):
            block, offset = divmod(live["picks"], BLOCK)
            order = self._order(live, block)
            for pick in order[offset:].tolist():
                it = iters[pick]
                sample = next(it, _END) if it is not None else _END
                if sample is _END and self.stop == "never":
                    source = self.sources[pick]
                    if hasattr(source, "set_epoch"):
                        source.set_epoch(getattr(source, "epoch", 0) + 1)
                    iters[pick] = iter(source)
                    sample = next(iters[pick], _END)
                    if sample is _END:
                        raise DatasetError(f"Mix: source {pick} yields nothing, even anew")
                if sample is _END:
                    if self.stop == "shortest":
                        live["active"][pick] = False
                        return
                    live["active"][pick] = False  # "longest": mix the others from here on
                    live.update(phase=live["phase"] + 1, picks=0, credits=[0.0] * len(iters))
                    break
                live["picks"] += 1
                if live["picks"] % BLOCK == 0:
                    live["credits"] = live["next_credits"]
                yield sample
