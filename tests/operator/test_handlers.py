"""Which ETLs a pod event wakes up, and the command line (no kopf run needed)."""

from __future__ import annotations

from etl_operator.__main__ import parse_args
from etl_operator.handlers import SelectorBook, _interesting_pod


class Memo:
    def __init__(self, book: SelectorBook) -> None:
        self.book = book


def test_target_pods_wake_the_etls_that_select_them():
    book = SelectorBook()
    book.put("ns", "default-sel", {})
    book.put("ns", "gpu", {"targetSelector": {"tier": "gpu"}})
    book.put("other", "elsewhere", {})
    assert book.selecting("ns", {"sluice.dev/role": "target"}) == ["default-sel"]
    assert book.selecting("ns", {"tier": "gpu", "x": "y"}) == ["gpu"]
    assert book.is_target("ns", {"tier": "gpu"})
    assert not book.is_target("ns", {"app": "web"})
    book.forget("ns", "gpu")
    assert book.selecting("ns", {"tier": "gpu"}) == []


def test_only_transformer_and_target_pods_pass_the_filter():
    memo = Memo(SelectorBook())
    assert _interesting_pod({"sluice.dev/etl": "x"}, "ns", memo)
    assert _interesting_pod({"sluice.dev/role": "target"}, "ns", memo)
    assert not _interesting_pod({"app": "web"}, "ns", memo)


def test_command_line():
    args = parse_args(["-n", "a", "--namespace", "b", "--standalone", "-v"])
    assert args.namespace == ["a", "b"] and args.standalone and args.verbose
    assert parse_args(["-A"]).all_namespaces


def test_resync_requests_only_where_this_replica_is_active():
    import asyncio
    import datetime as dt

    from etl_operator.handlers import _resync
    from etl_operator.peering import Peering

    now = dt.datetime.now(dt.UTC).isoformat()
    statuses = {
        "mine": {"me": {"priority": 9, "lastseen": now}, "other": {"priority": 3, "lastseen": now}},
        "theirs": {
            "me": {"priority": 9, "lastseen": now},
            "other": {"priority": 12, "lastseen": now},
        },
    }

    class Kube:
        def peering_status(self, namespace, name):
            assert name == "sluice"
            return statuses.get(namespace)

    class Controller:
        kube = Kube()

    class Queue:
        def __init__(self):
            self.requested: set[tuple[str, str]] = set()

        def request(self, namespace, name):
            self.requested.add((namespace, name))

    memo = Memo(SelectorBook())
    memo.book.put("mine", "a", {})
    memo.book.put("theirs", "b", {})
    memo.controller, memo.queue = Controller(), Queue()  # type: ignore[attr-defined]

    async def run(peering):
        memo.peering = peering  # type: ignore[attr-defined]
        memo.queue = Queue()  # type: ignore[attr-defined]
        task = asyncio.create_task(_resync(memo, 0.01))
        await asyncio.sleep(0.2)
        task.cancel()
        return memo.queue.requested  # type: ignore[attr-defined]

    me = Peering(name="sluice", identity="me", priority=9, clusterwide=False)
    assert asyncio.run(run(me)) == {("mine", "a")}
    assert asyncio.run(run(None)) == {("mine", "a"), ("theirs", "b")}
