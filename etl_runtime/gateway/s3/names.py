"""S3's bucket-name rules (CreateBucket), and the stored names of folder-marker keys.

The native API keeps its own, looser rule (``core.names.validate_bucket``:
1-63 letters, digits, ``.``, ``_``, ``-``); a bucket made through S3 follows
AWS's general-purpose rules, and a name that breaks one is 400
``InvalidBucketName`` naming the rule it breaks.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from etl_runtime.core.errors import S3Error

_CHARS = re.compile(r"[a-z0-9.-]+")
_IPV4 = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
RULES: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda b: not 3 <= len(b) <= 63, "must be 3 to 63 characters long"),
    (lambda b: not _CHARS.fullmatch(b), "may hold only lower-case letters, digits, '.' and '-'"),
    (
        lambda b: not (b[0].isalnum() and b[-1].isalnum()),
        "must begin and end with a letter or digit",
    ),
    (lambda b: ".." in b, "may not hold two adjacent periods"),
    (lambda b: ".-" in b or "-." in b, "may not hold a period next to a hyphen"),
    (lambda b: bool(_IPV4.fullmatch(b)), "may not be formatted as an IP address"),
    (lambda b: b.startswith(PREFIXES), f"may not start with {' or '.join(PREFIXES)}"),
    (lambda b: b.endswith(SUFFIXES), f"may not end with {' or '.join(SUFFIXES)}"),
)


def check_s3_bucket(bucket: str) -> None:
    for broken, rule in RULES:
        if broken(bucket):
            raise S3Error(
                "InvalidBucketName",
                400,
                f"bucket name {bucket!r}: a bucket name {rule}",
                bucket=bucket,
            )


FOLDER = ".s3-folder"  # the stored name of a folder marker's last segment (``stored``)


def stored(key: str) -> str:
    """The stored name of an S3 key: a folder marker ``dir/`` (a key ending in ``/``,
    which the store cannot hold as a file beside ``dir/x``) is ``dir/.s3-folder``."""
    return key + FOLDER if key.endswith("/") else key


def shown(name: str) -> str:
    """The S3 key of a stored name (``stored`` undone)."""
    return name[: -len(FOLDER)] if name.endswith("/" + FOLDER) else name
