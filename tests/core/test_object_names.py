"""Object names: the quick check for the usual name agrees with the rules, every time."""

from __future__ import annotations

import random

import pytest

from etl_runtime.core.errors import InvalidName
from etl_runtime.core.names import MAX_OBJECT_NAME, MAX_SEGMENT, validate_object


def allowed(name: str) -> bool:
    """The rules, as docs/api.md states them."""
    if not name or "\x00" in name or name.startswith("/"):
        return False
    if len(name.encode()) > MAX_OBJECT_NAME:
        return False
    return all(
        seg not in ("", ".", "..") and len(seg.encode()) <= MAX_SEGMENT for seg in name.split("/")
    )


def test_random_names_are_judged_by_the_rules() -> None:
    rng = random.Random(7)
    pieces = ["a", "b", "/", ".", "..", "\x00", "é", "x" * 200, "y" * 56, "-", " ", "\n"]
    for _ in range(20_000):
        name = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        try:
            validate_object("b", name)
            ok = True
        except InvalidName:
            ok = False
        assert ok == allowed(name), repr(name)


@pytest.mark.parametrize(
    "name", ["a/./b", "a/../b", "..", ".", "a//b", "a/", "/a", "a\x00b", "x" * 256, "é" * 128]
)
def test_refused_names_say_why(name: str) -> None:
    with pytest.raises(InvalidName, match="invalid object name"):
        validate_object("b", name)


@pytest.mark.parametrize("name", [".hidden", "a/.b/c", "a..b", "x" * 255, "é" * 127, "a b/c"])
def test_unusual_but_allowed_names(name: str) -> None:
    assert validate_object("b", name) == name
