"""S3's bucket-name rules, for every bucket Sluice creates.

A new bucket, however it is made (S3's CreateBucket, ``POST /v1/buckets/{b}``
create-bck from ``curl``, the ``sluice`` CLI/SDK or the aistore SDK's
``bucket.create()``, an ETL view, a transform's, copy's, rename's or dsort's
destination), follows AWS's general-purpose bucket rules: 3 to 63 characters,
lower-case letters, digits, ``.`` and ``-``, and the rest of ``RULES``. A name
that breaks one is a 400 naming the bucket and the rule.

Only creation is refused: a bucket that already exists under a looser name
(made by an older version, whose rule was ``core.names.validate_bucket``'s
1-63 letters, digits, ``.``, ``_``, ``-``) is read, written, listed and
deleted as before. A remote bucket is named by its backend and only attached,
so its backend's rules apply, not these.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from etl_runtime.core.errors import InvalidName

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


def broken_rule(bucket: str) -> str | None:
    """The first of S3's bucket-name rules ``bucket`` breaks, or None."""
    for broken, rule in RULES:
        if broken(bucket):
            return rule
    return None


def why_invalid(bucket: str, rule: str) -> str:
    return f"bucket name {bucket!r}: a bucket name {rule}"


def check_new_bucket(bucket: str) -> None:
    """400 ``InvalidName`` naming ``bucket`` and the rule it breaks, for a bucket to be made."""
    rule = broken_rule(bucket)
    if rule is not None:
        raise InvalidName(why_invalid(bucket, rule) + " (S3's bucket-name rules)", bucket=bucket)
