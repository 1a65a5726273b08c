"""Mix: datasets interleaved by weight, deterministic, with stop rules, resumable."""

from __future__ import annotations

from collections import Counter
from itertools import islice

import pytest

from etl_runtime.pytorch import Mix, ObjectIterDataset, Source
from tests.pytorch.conftest import OBJECTS

pytestmark = pytest.mark.torch
torch_data = pytest.importorskip("torch.utils.data")
Loader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader


class Numbers(torch_data.IterableDataset):
    """An in-memory source: ``(name, i)`` for i < n."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    def __iter__(self):
        return ((self.name, i) for i in range(self.n))


def test_realised_shares_within_1_percent_over_10k_and_deterministic() -> None:
    def first(weights: dict, seed: int, n: int = 10_000) -> list[str]:
        mix = Mix({Numbers(k, 500): w for k, w in weights.items()}, seed=seed, stop="never")
        return [name for name, _ in islice(mix, n)]

    for weights in ({"a": 0.7, "b": 0.3}, {"a": 5, "b": 3, "c": 2}):
        picks = first(weights, seed=1)
        total = sum(weights.values())
        for k, w in weights.items():
            assert abs(picks.count(k) / len(picks) - w / total) < 0.01, (k, weights)
        assert picks == first(weights, seed=1)  # the same seed, the same stream
        assert picks != first(weights, seed=2)
    mix = Mix({Numbers("a", 500): 0.7, Numbers("b", 500): 0.3}, seed=1, stop="never")
    # never: a source that runs out starts again (a: 700 picks of 500 numbers)
    assert [i for name, i in islice(mix, 1000) if name == "a"][:502] == [*range(500), 0, 1]


@pytest.fixture(scope="module")
def view(client, objects, etls):
    """An ETL view of the objects bucket: every object upper-cased on its target."""
    return client.bucket("pt-objects-upper").create(view_of=objects.name, etl=etls[0])


def sources(objects, view, seed: int = 0):
    a = ObjectIterDataset(Source(objects, prefix="a/"), shuffle=True, seed=seed)
    b = ObjectIterDataset(Source(view, prefix="b/"))
    return a, b


def test_stop_rules_over_a_bucket_and_a_view(objects, view) -> None:
    names = {k: [n for n in OBJECTS if n.startswith(k)] for k in ("a/", "b/")}
    a, b = sources(objects, view)
    shortest = list(Mix({a: 0.25, b: 0.75}, seed=3))  # b (12 objects) runs out first
    got = Counter(n[:2] for n, _ in shortest)
    assert got["b/"] == 12 and 2 <= got["a/"] <= 6
    for name, data in shortest:
        want = OBJECTS[name].upper() if name.startswith("b/") else OBJECTS[name]
        assert data == want  # the view's objects come through its ETL

    longest = list(Mix({a: 0.25, b: 0.75}, seed=3, stop="longest"))
    assert Counter(n for n, _ in longest) == Counter(names["a/"] + names["b/"])
    assert longest[: len(shortest)] == shortest

    # never: 64 picks (one block) are 32 of each, every object of each read 2 or 3 times
    never = Counter(n for n, _ in islice(Mix({a: 0.5, b: 0.5}, seed=3, stop="never"), 64))
    assert sum(c for n, c in never.items() if n.startswith("a/")) == 32
    assert set(never) == set(names["a/"] + names["b/"]) and set(never.values()) == {2, 3}


def mix_of(objects, view, stop="shortest") -> Mix:
    a, b = sources(objects, view, seed=1)
    return Mix({a: 0.6, b: 0.4}, seed=7, stop=stop)


def test_mix_resumes_exactly_in_the_same_layout_and_elastically(objects, view) -> None:
    def loader(workers: int, mix: Mix | None = None) -> Loader:
        mix = mix or mix_of(objects, view)
        return Loader(mix, batch_size=None, num_workers=workers)

    whole = [n for n, _ in loader(2)]
    first = loader(2)
    it = iter(first)
    head = [n for n, _ in islice(it, 7)]
    state = first.state_dict()
    del it, first
    again = loader(2)
    again.load_state_dict(state)
    assert head + [n for n, _ in again] == whole  # the same stream, resumed

    # Another worker count: each source goes on exactly where the mix left it.
    longest = mix_of(objects, view, stop="longest")
    first = loader(2, longest)
    it = iter(first)
    head = [n for n, _ in islice(it, 9)]
    state = first.state_dict()
    del it, first
    resumed = mix_of(objects, view, stop="longest")
    resumed.load_state_dict(Mix.merge_positions([state]))
    rest = [n for n, _ in loader(3, resumed)]
    assert Counter(head + rest) == Counter(list(OBJECTS))
