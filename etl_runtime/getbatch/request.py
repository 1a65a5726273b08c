"""A GetBatch request (AIStore's ``apc.MossReq``) read, checked and planned.

Everything that can be refused is refused here, before any target is asked
and before the first byte of the answer: unknown fields (top level and per
item, each named), bad names, items without a bucket, buckets the cluster
map does not list, a format Sluice does not write, byte ranges that make no
sense or that an ETL cannot honour.

Naming inside the answer's archive (AIStore's ``MossIn.NameInRespArch``):
``<bucket>/<object>``, or ``<object>`` with ``onob``; a file from a shard
adds ``/<archpath>``. A missing item (``coer`` set) is a zero-size entry
under ``__404__/``: the whole name for a file missing from its shard, the
name without the archpath when the shard itself is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from etl_runtime.cluster.clustermap import ClusterMap
from etl_runtime.core import providers
from etl_runtime.core.errors import InvalidRequest, bucket_not_found
from etl_runtime.core.names import validate_bucket, validate_object
from etl_runtime.etl.pipeline import parse_chain

MISSING_DIR = "__404__"
MAX_ITEMS = 100_000
REQUEST_FIELDS = frozenset({"in", "mime", "coer", "onob", "strm", "coloc"})
ITEM_FIELDS = frozenset(
    {"objname", "bucket", "provider", "uname", "archpath", "opaque", "start", "length"}
)
PLAIN_FIELDS = frozenset({"objname", "bucket", "provider"})  # one bucket check per request
# "mime" as the SDK sends it ("" and the bare words too) -> (format, Content-Type)
FORMATS = {
    "": (".tar", "application/x-tar"),
    ".tar": (".tar", "application/x-tar"),
    ".tgz": (".tgz", "application/gzip"),
    ".tar.gz": (".tgz", "application/gzip"),
}
FORMATS.update({k[1:]: v for k, v in list(FORMATS.items()) if k})
PROVIDERS = {"": "", **{s: str(providers.canonical(s)) for s in providers.spellings()}}


@dataclass(slots=True, eq=False)  # made per item of every batch: frozen cost 3x the __init__
class Item:
    index: int
    bucket: str
    provider: str  # "" (ais) or a remote provider's name (core/providers.py)
    name: str
    archpath: str = ""
    start: int = 0
    length: int = 0  # 0: the whole object (or file); -1: from start to the end
    opaque: str | None = None  # base64 as sent; answered as is
    etl: tuple[str, ...] = ()  # the ETL chain every byte goes through: the batch's or a view's
    etl_args: str | None = None
    source: str = ""  # the bucket read, when ``bucket`` is a view of it
    source_provider: str = ""  # and its provider ("" or a remote provider's name)

    @property
    def read_bucket(self) -> str:
        return self.source or self.bucket

    @property
    def read_provider(self) -> str:
        return self.source_provider if self.source else self.provider

    @property
    def ranged(self) -> bool:
        return self.start != 0 or self.length != 0

    def cname(self) -> str:
        """``ais://b/o`` (what the aistore SDK parses a not-found error for), ``/archpath``."""
        scheme = self.provider or "ais"
        where = f"{scheme}://{self.bucket}/{self.name}"
        return f"{where}/{self.archpath.lstrip('/')}" if self.archpath else where


@dataclass(frozen=True)
class BatchRequest:
    items: list[Item]
    fmt: str  # ".tar" or ".tgz"
    content_type: str
    cont_on_err: bool
    only_obj_name: bool
    streaming: bool
    etl_name: str | None = None
    etl_args: str | None = None
    etl_pipeline: str | None = None

    def name_in_archive(self, item: Item) -> str:
        base = item.name if self.only_obj_name else f"{item.bucket}/{item.name}"
        if not item.archpath:
            return base
        return base + item.archpath if item.archpath.startswith("/") else f"{base}/{item.archpath}"

    def missing_name(self, item: Item, shard_missing: bool) -> str:
        """``__404__/...``; without the archpath when the shard itself is missing."""
        if shard_missing:
            base = item.name if self.only_obj_name else f"{item.bucket}/{item.name}"
            return f"{MISSING_DIR}/{base}"
        return f"{MISSING_DIR}/{self.name_in_archive(item)}"


def _refuse_unknown(got: dict[str, Any], known: frozenset[str], where: str) -> None:
    if got.keys() <= known:  # the usual case, in C
        return
    unknown = sorted(set(got) - known)
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(repr(k) for k in unknown)} in {where}; "
            f"known: {', '.join(sorted(known))}"
        )


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"GetBatch field {key!r} must be true or false, got {value!r}")
    return value


def _int(raw: dict[str, Any], key: str, i: int) -> int:
    value = raw.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"in[{i}].{key} must be an integer, got {value!r}")
    return value


def _string(raw: dict[str, Any], key: str, i: int) -> str:
    value = raw.get(key) or ""
    if not isinstance(value, str):
        raise InvalidRequest(f"in[{i}].{key} must be a string, got {value!r}")
    return value


def _archpath(value: str, i: int) -> str:
    if not value:  # the usual case: a whole object
        return value
    if "\x00" in value or ".." in value.split("/"):
        raise InvalidRequest(f"in[{i}].archpath {value!r} is not a valid path inside a shard")
    return value


def _item(
    raw: Any,
    i: int,
    default_bucket: str | None,
    default_provider: str,
    cmap: ClusterMap | None,
    chain: tuple[str, ...] = (),
    etl_args: str | None = None,
    checked: set[tuple[str, str]] | None = None,
) -> Item:
    """Item ``i``. ``checked``: the (bucket, provider) pairs whose bucket checks passed
    already in this request (a batch names few buckets: each is looked at once)."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"in[{i}] must be an object with at least 'objname'")
    _refuse_unknown(raw, ITEM_FIELDS, f"in[{i}]")
    if raw.get("uname"):
        raise InvalidRequest(f"in[{i}].uname is not supported by Sluice: give bucket and provider")
    name = _string(raw, "objname", i)
    bucket = _string(raw, "bucket", i) or default_bucket
    provider_raw = _string(raw, "provider", i) or ("" if raw.get("bucket") else default_provider)
    if not bucket:
        raise InvalidRequest(
            f"in[{i}] ({name!r}) names no bucket: give 'bucket' per item, or the default "
            "bucket in the path (/v1/ml/moss/<bucket>)"
        )
    provider = PROVIDERS.get(provider_raw)
    if provider is None:
        raise InvalidRequest(
            f"in[{i}].provider {provider_raw!r} is not supported: {providers.described()}",
            bucket=bucket,
        )
    if checked is None or (bucket, provider) not in checked:
        validate_bucket(bucket)
    validate_object(bucket, name)
    view: dict[str, Any] = {}
    if cmap is not None:
        props = cmap.buckets.get(bucket)
        if props is None:
            raise bucket_not_found(bucket)
        view = props.view
        if (provider or "ais") != props.provider:
            raise InvalidRequest(
                f"in[{i}]: bucket {bucket!r} is a {props.provider!r} bucket, not "
                f"{provider or 'ais'!r}",
                bucket=bucket,
            )
    if checked is not None:
        checked.add((bucket, provider))
    start, length = _int(raw, "start", i), _int(raw, "length", i)
    if start < 0 or length < -1 or (start and not length):
        raise InvalidRequest(
            f"in[{i}]: byte range start={start} length={length}: start >= 0, and length > 0 "
            "or -1 (to the end); a non-zero start needs a length",
            bucket=bucket,
            object=name,
        )
    opaque = raw.get("opaque")
    if opaque is not None and not isinstance(opaque, str):
        raise InvalidRequest(f"in[{i}].opaque must be a base64 string")
    etl, args, source, source_provider = chain, etl_args, "", ""
    if view:
        if chain:
            raise InvalidRequest(
                f"in[{i}]: bucket {bucket!r} is an ETL view (of {view.get('of')!r} through "
                f"ETL {view.get('etl')!r}) and already names its ETL: drop etl_name, or read "
                "the source bucket with it",
                bucket=bucket,
                etl=chain[0],
            )
        etl, args, source = (str(view["etl"]),), view.get("args"), str(view["of"])
        assert cmap is not None
        src_props = cmap.buckets.get(source)
        if src_props is None:  # deleting a source that views read is refused: a race
            raise bucket_not_found(source)
        source_provider = src_props.provider if src_props.remote else ""
    if etl and (start or length):
        raise InvalidRequest(
            f"in[{i}]: a byte range (start/length) cannot be combined with "
            f"{'the view' + chr(39) + 's ETL' if source else 'etl_name='}{etl[0]!r}: the "
            "transformed object has no known size",
            bucket=bucket,
            object=name,
            etl=etl[0],
        )
    return Item(
        index=i,
        bucket=bucket,
        provider=provider if providers.is_remote(provider) else "",
        name=name,
        archpath=_archpath(_string(raw, "archpath", i), i),
        start=start,
        length=length,
        opaque=opaque or None,
        etl=etl,
        etl_args=args,
        source=source,
        source_provider=source_provider,
    )


def parse_request(
    body: Any,
    default_bucket: str | None,
    default_provider: str,
    cmap: ClusterMap | None,
    etl_name: str | None = None,
    etl_args: str | None = None,
    etl_pipeline: str | None = None,
) -> BatchRequest:
    if not isinstance(body, dict):
        raise InvalidRequest('a GetBatch body is a JSON object: {"in": [{"objname": ...}]}')
    _refuse_unknown(body, REQUEST_FIELDS, "the GetBatch request")
    raw_items = body.get("in")
    if not isinstance(raw_items, list) or not raw_items:
        raise InvalidRequest("GetBatch needs 'in': a non-empty list of items")
    if len(raw_items) > MAX_ITEMS:
        raise InvalidRequest(f"GetBatch takes at most {MAX_ITEMS} items, got {len(raw_items)}")
    mime = body.get("mime") or ""
    if not isinstance(mime, str) or mime.lower() not in FORMATS:
        raise InvalidRequest(
            f"output format (mime) {mime!r} is not supported by Sluice: '.tar' (default), "
            "'.tgz' or '.tar.gz'"
        )
    coloc = body.get("coloc") or 0
    if isinstance(coloc, bool) or not isinstance(coloc, int) or not 0 <= coloc <= 2:
        raise InvalidRequest(f"coloc must be 0, 1 or 2, got {coloc!r}")
    fmt, content_type = FORMATS[mime.lower()]
    chain = tuple(parse_chain(etl_name, etl_pipeline))
    checked: set[tuple[str, str]] = set()
    # (bucket, provider) as an item of PLAIN_FIELDS gave them -> (bucket, provider) checked:
    # the next such item of the same bucket needs only its name checked
    plain: dict[tuple[str | None, str | None], tuple[str, str]] = {}
    items = []
    for i, r in enumerate(raw_items):
        if type(r) is dict and r.keys() <= PLAIN_FIELDS:
            b, p, name = r.get("bucket"), r.get("provider"), r.get("objname")
            if (b is None or type(b) is str) and (p is None or type(p) is str):
                hit = plain.get((b, p))
                if hit is not None and type(name) is str:
                    validate_object(hit[0], name)
                    items.append(Item(i, hit[0], hit[1], name, etl=chain, etl_args=etl_args))
                    continue
                item = _item(r, i, default_bucket, default_provider, cmap, chain, etl_args, checked)
                if not item.source:  # not a view (whose items carry its ETL and source)
                    plain[(b, p)] = (item.bucket, item.provider)
                items.append(item)
                continue
        items.append(_item(r, i, default_bucket, default_provider, cmap, chain, etl_args, checked))
    return BatchRequest(
        items=items,
        fmt=fmt,
        content_type=content_type,
        cont_on_err=_flag(body, "coer"),
        only_obj_name=_flag(body, "onob"),
        streaming=_flag(body, "strm"),
        etl_name=etl_name or None,
        etl_args=etl_args,
        etl_pipeline=etl_pipeline,
    )
