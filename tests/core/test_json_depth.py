"""The nesting guard every JSON body goes through (``core/jsonbody.py``)."""

from __future__ import annotations

import json

import pytest

from etl_runtime.core.jsonbody import MAX_DEPTH, nesting_depth


@pytest.mark.parametrize(
    ("doc", "depth"),
    [
        (1, 0),
        ([], 1),
        ({"in": [{"objname": "a]]]}}}["}, {"objname": "b"}]}, 3),
        ([[[[{"x": [1, '[[[["[[']}]]]], 6),
        ({"a": [], "b": {"c": [[]]}, "d": "}}}}"}, 4),
    ],
)
def test_depth_of_json_documents_strings_do_not_count(doc: object, depth: int) -> None:
    assert nesting_depth(json.dumps(doc).encode()) == depth


def test_deeper_than_the_limit_is_seen_without_walking_it_all() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert nesting_depth(deep) > MAX_DEPTH
    at = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert nesting_depth(at) == MAX_DEPTH
    assert nesting_depth(b"[" + at + b"]") > MAX_DEPTH


def test_brackets_that_do_not_pair_are_left_to_the_parser() -> None:
    for bad in (b"[{]}", b"[[[", b"]]]", b"[" * 100_000):
        depth = nesting_depth(bad)
        with pytest.raises((ValueError, RecursionError)):
            json.loads(bad)
        assert depth >= 0


def test_escaped_quotes_and_backslashes_in_strings() -> None:
    doc = {"a": ['x\\"[[[', "\\\\", {"b": '"]]]}}'}], "c": "\\"}
    assert nesting_depth(json.dumps(doc).encode()) == 3
