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
