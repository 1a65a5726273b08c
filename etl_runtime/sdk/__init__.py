"""The Sluice Python SDK: ``Client`` -> ``Bucket`` -> ``Object``, and ``Etl``.

from etl_runtime import Client

client = Client("http://127.0.0.1:8080")
bucket = client.bucket("images").create()
bucket.object("a.txt").put_content(b"hello")
client.etl("upper").init_code(transform=lambda data: data.upper())
bucket.object("a.txt").get_bytes(etl_name="upper")  # b"HELLO"
"""

from __future__ import annotations

from etl_runtime.sdk.batch import BatchItem
from etl_runtime.sdk.bucket import Bucket
from etl_runtime.sdk.client import Client
from etl_runtime.sdk.errors import (
    BadRequest,
    Conflict,
    EtlError,
    Forbidden,
    HTTPError,
    InsufficientStorage,
    NetworkError,
    NotFound,
    ServerError,
    SluiceError,
    StreamError,
    TransformError,
    Unauthorized,
    Unavailable,
)
from etl_runtime.sdk.etl import Etl, EtlDetails, EtlSummary
from etl_runtime.sdk.job import Job, JobError, JobTimeout
from etl_runtime.sdk.object import Object, ObjectInfo, ObjectReader
from etl_runtime.sdk.retry import RetryPolicy

__all__ = [
    "BadRequest",
    "BatchItem",
    "Bucket",
    "Client",
    "Conflict",
    "Etl",
    "EtlDetails",
    "EtlError",
    "EtlSummary",
    "Forbidden",
    "HTTPError",
    "InsufficientStorage",
    "Job",
    "JobError",
    "JobTimeout",
    "NetworkError",
    "NotFound",
    "Object",
    "ObjectInfo",
    "ObjectReader",
    "RetryPolicy",
    "ServerError",
    "SluiceError",
    "StreamError",
    "TransformError",
    "Unauthorized",
    "Unavailable",
]
