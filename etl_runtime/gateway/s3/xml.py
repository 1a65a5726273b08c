"""S3's XML bodies: written with escaping by hand (small, fixed shapes), read with ElementTree."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from etl_runtime.core.errors import S3Error

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n'
MAX_XML_BODY = 2 << 20  # DeleteObjects of 1000 long keys fits


OWNER = "<Owner><ID>sluice</ID><DisplayName>sluice</DisplayName></Owner>"


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _el(tag: str, value: Any) -> str:
    return f"<{tag}>{escape(str(value))}</{tag}>"


def document(root: str, inner: Iterable[str]) -> bytes:
    return (HEAD + f'<{root} xmlns="{NS}">' + "".join(inner) + f"</{root}>").encode()


def error(code: str, message: str, resource: str, request_id: str) -> bytes:
    inner = _el("Code", code) + _el("Message", message) + _el("Resource", resource)
    return (HEAD + "<Error>" + inner + _el("RequestId", request_id) + "</Error>").encode()


def list_buckets(
    names: list[str], created: dict[str, float], token: str | None, prefix: str | None
) -> bytes:
    """ListAllMyBucketsResult: ``token`` the page's ``ContinuationToken`` (None: the last)."""
    buckets = "".join(
        "<Bucket>"
        + _el("Name", n)
        + _el("CreationDate", iso(created.get(n, 0)))
        + _el("BucketRegion", "us-east-1")
        + "</Bucket>"
        for n in names
    )
    inner = [OWNER, f"<Buckets>{buckets}</Buckets>"]
    inner += [_el("ContinuationToken", token)] if token else []
    inner += [_el("Prefix", prefix)] if prefix is not None else []
    return document("ListAllMyBucketsResult", inner)


def list_objects_v2(
    bucket: str,
    params: dict[str, str],
    contents: list[dict[str, Any]],
    prefixes: list[str],
    next_token: str | None,
    encode: Any,
) -> bytes:
    """``encode``: the ``encoding-type=url`` quoting of names, or the identity."""
    inner = [_el("Name", bucket), _el("Prefix", encode(params.get("prefix", "")))]
    if params.get("delimiter"):
        inner.append(_el("Delimiter", encode(params["delimiter"])))
    inner += [_el("MaxKeys", params["max-keys"]), _el("KeyCount", len(contents) + len(prefixes))]
    inner.append(_el("IsTruncated", "true" if next_token else "false"))
    if "continuation-token" in params:
        inner.append(_el("ContinuationToken", params["continuation-token"]))
    if next_token:
        inner.append(_el("NextContinuationToken", next_token))
    if params.get("start-after"):
        inner.append(_el("StartAfter", encode(params["start-after"])))
    if params.get("encoding-type"):
        inner.append(_el("EncodingType", params["encoding-type"]))
    owner = params.get("fetch-owner", "").lower() == "true"
    inner += _contents(contents, prefixes, encode, owner)
    return document("ListBucketResult", inner)


def list_objects_v1(
    bucket: str,
    params: dict[str, str],
    contents: list[dict[str, Any]],
    prefixes: list[str],
    truncated: bool,
    cursor: str,
    encode: Any,
) -> bytes:
    """ListObjects (V1): ``Marker``/``NextMarker`` instead of continuation tokens."""
    inner = [_el("Name", bucket), _el("Prefix", encode(params.get("prefix", "")))]
    inner.append(_el("Marker", encode(params.get("marker", ""))))
    if params.get("delimiter"):
        inner.append(_el("Delimiter", encode(params["delimiter"])))
    inner += [_el("MaxKeys", params["max-keys"])]
    inner.append(_el("IsTruncated", "true" if truncated else "false"))
    if truncated:
        inner.append(_el("NextMarker", encode(cursor)))
    if params.get("encoding-type"):
        inner.append(_el("EncodingType", params["encoding-type"]))
    inner += _contents(contents, prefixes, encode, owner=True)  # V1 always names the owner
    return document("ListBucketResult", inner)


def list_versions(
    bucket: str,
    params: dict[str, str],
    contents: list[dict[str, Any]],
    prefixes: list[str],
    truncated: bool,
    cursor: str,
    encode: Any,
) -> bytes:
    """ListVersionsResult of a bucket without versioning: each object its one ``null`` version."""
    inner = [_el("Name", bucket), _el("Prefix", encode(params.get("prefix", "")))]
    inner += [_el("KeyMarker", encode(params.get("key-marker", "")))]
    inner += [_el("VersionIdMarker", params.get("version-id-marker", ""))]
    if params.get("delimiter"):
        inner.append(_el("Delimiter", encode(params["delimiter"])))
    inner += [_el("MaxKeys", params["max-keys"])]
    inner.append(_el("IsTruncated", "true" if truncated else "false"))
    if truncated:
        inner += [_el("NextKeyMarker", encode(cursor)), _el("NextVersionIdMarker", "null")]
    if params.get("encoding-type"):
        inner.append(_el("EncodingType", params["encoding-type"]))
    inner += [
        "<Version>"
        + _el("Key", encode(o["name"]))
        + _el("VersionId", "null")
        + _el("IsLatest", "true")
        + _el("LastModified", iso(o["mtime"]))
        + _el("ETag", f'"{o["etag"]}"')
        + _el("Size", listed_size(o))
        + _el("StorageClass", "STANDARD")
        + OWNER
        + "</Version>"
        for o in contents
    ]
    inner += ["<CommonPrefixes>" + _el("Prefix", encode(p)) + "</CommonPrefixes>" for p in prefixes]
    return document("ListVersionsResult", inner)


def listed_size(o: dict[str, Any]) -> int:
    """An entry's size; for an ETL view's entry (size unknown) the source object's."""
    size = o["size"] if o["size"] is not None else o.get("source_size")
    return int(size or 0)


def _contents(
    contents: list[dict[str, Any]], prefixes: list[str], encode: Any, owner: bool
) -> list[str]:
    tail = "<StorageClass>STANDARD</StorageClass>" + (OWNER if owner else "") + "</Contents>"
    inner = [
        "<Contents>"
        + _el("Key", encode(o["name"]))
        + _el("LastModified", iso(o["mtime"]))
        + _el("ETag", f'"{o["etag"]}"')
        + _el("Size", listed_size(o))
        + tail
        for o in contents
    ]
    inner += ["<CommonPrefixes>" + _el("Prefix", encode(p)) + "</CommonPrefixes>" for p in prefixes]
    return inner


def delete_result(
    deleted: list[tuple[str, str | None]], errors: list[tuple[str, str, str]], quiet: bool
) -> bytes:
    """DeleteResult: ``deleted`` as (key, the VersionId asked or None)."""
    inner = (
        []
        if quiet
        else [
            "<Deleted>" + _el("Key", k) + (_el("VersionId", v) if v else "") + "</Deleted>"
            for k, v in deleted
        ]
    )
    inner += [
        "<Error>" + _el("Key", k) + _el("Code", c) + _el("Message", m) + "</Error>"
        for k, c, m in errors
    ]
    return document("DeleteResult", inner)


def initiate_upload(bucket: str, key: str, upload_id: str) -> bytes:
    return document(
        "InitiateMultipartUploadResult",
        [_el("Bucket", bucket), _el("Key", key), _el("UploadId", upload_id)],
    )


def complete_upload(location: str, bucket: str, key: str, etag: str) -> bytes:
    return document(
        "CompleteMultipartUploadResult",
        [_el("Location", location), _el("Bucket", bucket), _el("Key", key), _el("ETag", etag)],
    )


def copy_result(root: str, etag: str, mtime: float) -> bytes:
    """CopyObjectResult (``root``) or CopyPartResult: the new ETag and its time."""
    return document(root, [_el("ETag", etag), _el("LastModified", iso(mtime))])


def list_uploads(
    bucket: str, params: dict[str, str], uploads: list[tuple[str, str, float]], truncated: bool
) -> bytes:
    """ListMultipartUploadsResult: ``uploads`` as (key, upload id, initiated)."""
    inner = [_el("Bucket", bucket)]
    inner += [_el("KeyMarker", params.get("key-marker", ""))]
    inner += [_el("UploadIdMarker", params.get("upload-id-marker", ""))]
    if truncated and uploads:
        inner += [_el("NextKeyMarker", uploads[-1][0]), _el("NextUploadIdMarker", uploads[-1][1])]
    inner += [_el("Prefix", params.get("prefix", "")), _el("MaxUploads", params["max-uploads"])]
    inner += [_el("IsTruncated", "true" if truncated else "false")]
    for key, upload_id, initiated in uploads:
        inner.append(
            "<Upload>"
            + _el("Key", key)
            + _el("UploadId", upload_id)
            + _el("StorageClass", "STANDARD")
            + _el("Initiated", iso(initiated))
            + "</Upload>"
        )
    return document("ListMultipartUploadsResult", inner)


def list_parts(bucket: str, key: str, upload_id: str, parts: list[dict[str, Any]]) -> bytes:
    inner = [_el("Bucket", bucket), _el("Key", key), _el("UploadId", upload_id)]
    inner += [_el("IsTruncated", "false"), _el("MaxParts", 10000)]
    for p in parts:
        inner.append(
            "<Part>"
            + _el("PartNumber", p["number"])
            + _el("LastModified", iso(p["mtime"]))
            + _el("ETag", f'"{p["etag"]}"')
            + _el("Size", p["size"])
            + "</Part>"
        )
    return document("ListPartsResult", inner)


def location(region: str) -> bytes:
    return document("LocationConstraint", [escape(region)] if region != "us-east-1" else [])


def parse(body: bytes, root: str) -> ElementTree.Element:
    """The body's root element, which must be ``root`` (any namespace)."""
    if len(body) > MAX_XML_BODY:
        raise S3Error("MalformedXML", 400, f"the XML body is larger than {MAX_XML_BODY} bytes")
    try:
        el = ElementTree.fromstring(body)
    except ElementTree.ParseError as e:
        raise S3Error("MalformedXML", 400, f"the XML body does not parse: {e}") from None
    if local(el.tag) != root:
        raise S3Error("MalformedXML", 400, f"expected <{root}>, got <{local(el.tag)}>")
    return el


def local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def children(el: ElementTree.Element, tag: str) -> list[ElementTree.Element]:
    return [c for c in el if local(c.tag) == tag]


def text(el: ElementTree.Element, tag: str) -> str | None:
    found = children(el, tag)
    return (found[0].text or "") if found else None
