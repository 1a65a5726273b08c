"""A pipeline step whose input, the step before, broke off before it answered.

The second step's ``PUT`` then fails because its body source failed; the answer
must be the first ETL's failure (what its transformer's marker said), not a
503 "the transformer of the second ETL did not answer, retry shortly". The
real race is in ``tests/storage_target/test_wds_relay_break.py``; here each
outcome, built as ``DuplexClient`` chains the exceptions.
"""

from __future__ import annotations

from etl_runtime.core.errors import (
    BadResult,
    EtlNotReady,
    StreamBroken,
    TransformError,
    WorkerDied,
)
from etl_runtime.etl.streambreak import TransformerStreamBroken, upstream_error


def _chain(broken: TransformerStreamBroken) -> StreamBroken:
    """As ``duplex``: the sender's failure, wrapped twice."""
    try:
        try:
            raise StreamBroken(f"sending the request failed: {broken!r}") from broken
        except StreamBroken as e:
            raise StreamBroken(f"PUT http://t/b/o: {e}") from e
    except StreamBroken as outer:
        return outer


def test_a_failing_function_keeps_its_status_and_names_the_first_etl() -> None:
    marked = ("s060", "ETL 'first', object 'b/o.tar': poisoned sample", "TransformError")
    err = upstream_error(_chain(TransformerStreamBroken("m", "first", marked)), "t0", "b", "o.tar")
    assert isinstance(err, TransformError) and err.status == 422
    assert err.message == "ETL 'first', object 'b/o.tar': poisoned sample"
    assert err.body() == {
        "error": err.message,
        "kind": "TransformError",
        "etl": "first",
        "bucket": "b",
        "object": "o.tar",
        "sample": "s060",
    }
    bad = upstream_error(
        _chain(TransformerStreamBroken("m", "first", ("s1", "returned int", "BadResult"))),
        "t0",
        "b",
        "o",
    )
    assert isinstance(bad, BadResult) and bad.status == 422


def test_a_dead_worker_or_no_marker_is_a_503_naming_the_first_etl() -> None:
    died = upstream_error(
        _chain(TransformerStreamBroken("m", "first", ("s1", "died", "WorkerDied"))), "t0", "b", "o"
    )
    assert isinstance(died, WorkerDied) and died.status == 503
    assert "Retry-After" in died.headers and died.context["etl"] == "first"
    for marked in (None, ("s1", "TypeError: x", None)):  # no marker; one with no kind
        err = upstream_error(
            _chain(TransformerStreamBroken("cut", "first", marked)), "t0", "b", "o"
        )
        assert isinstance(err, EtlNotReady) and err.status == 503
        assert err.context["etl"] == "first"
        assert err.message.startswith("the transformer of ETL 'first' on target 't0' broke off")


def test_a_failure_of_this_step_itself_is_left_to_the_caller() -> None:
    assert upstream_error(StreamBroken("connection refused"), "t0", "b", "o") is None
