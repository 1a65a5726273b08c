"""A "user module" outside site-packages: the SDK must pickle it by value."""

from __future__ import annotations

SUFFIX = b"!"


def shout(data: bytes) -> bytes:
    return data.upper() + SUFFIX
