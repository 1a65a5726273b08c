"""S3's bucket-name rules (CreateBucket), and the stored names of folder-marker keys.

The rules are ``core.bucket_rules``'s, the same for every bucket Sluice makes
(native create-bck, views, job destinations): a bucket made through S3 whose
name breaks one is 400 ``InvalidBucketName`` naming the rule it breaks.
"""

from __future__ import annotations

from etl_runtime.core.bucket_rules import broken_rule, why_invalid
from etl_runtime.core.errors import S3Error


def check_s3_bucket(bucket: str) -> None:
    rule = broken_rule(bucket)
    if rule is not None:
        raise S3Error("InvalidBucketName", 400, why_invalid(bucket, rule), bucket=bucket)


FOLDER = ".s3-folder"  # the stored name of a folder marker's last segment (``stored``)


def stored(key: str) -> str:
    """The stored name of an S3 key: a folder marker ``dir/`` (a key ending in ``/``,
    which the store cannot hold as a file beside ``dir/x``) is ``dir/.s3-folder``."""
    return key + FOLDER if key.endswith("/") else key


def shown(name: str) -> str:
    """The S3 key of a stored name (``stored`` undone)."""
    return name[: -len(FOLDER)] if name.endswith("/" + FOLDER) else name
