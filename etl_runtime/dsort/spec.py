"""The dSort job spec: AIStore's JSON as users write it, checked field by field.

Accepted keys (AIStore's names; the older ``bck``/``extension`` and the newer
``input_bck``/``input_extension``/``output_extension`` both work)::

    extension          ".tar" (input and output shards; only tar is supported)
    bck | input_bck    {"name": "...", "provider": "ais"}
    input_format       "shard-{000..099}" or {"template": ...} or {"objnames": [...]}
    output_format      "shuffled-%06d.tar" (printf) or "new-shard-{0000..1000}" (brace)
    output_shard_size  "100MB", "1GiB", 10240 (MB = 10^6 bytes, MiB = 2^20)
    algorithm          {"kind": "shuffle" | "alphanumeric" | "none", "seed": "...",
                        "decreasing": false}
    output_bck         defaults to the input bucket
    description        free text
    missing_shards     "ignore" (default, as AIStore's) | "warn" | "abort"

``extract_concurrency_max_limit`` and ``create_concurrency_max_limit`` bound
the shards each target indexes and the output shards it sends or publishes at
once (0: the defaults, 2 and 4). AIStore knobs that mean nothing here
(``max_mem_usage``, ``dsorter_type``, ``duplicated_records``) are accepted and
ignored; features Sluice does not have (``ekm_file``,
``dry_run``, ``kind: content``, ``.tgz``) are refused with a 400 naming the
field, and so is any key not listed here. A shard name from a template gets
the extension appended unless it already ends with it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from braceexpand import braceexpand
from pydantic import ByteSize, TypeAdapter, ValidationError

from etl_runtime.core.errors import InvalidDsortSpec, InvalidName
from etl_runtime.core.names import validate_bucket, validate_object

KINDS = ("shuffle", "alphanumeric", "none")
MISSING_SHARDS = ("abort", "warn", "ignore")
MAX_INPUT_SHARDS = 1_000_000
_IGNORED = {
    "max_mem_usage": str,
    "dsorter_type": str,
    "duplicated_records": str,
}
_KNOWN = {
    "extension",
    "input_extension",
    "output_extension",
    "bck",
    "input_bck",
    "output_bck",
    "input_format",
    "output_format",
    "output_shard_size",
    "algorithm",
    "description",
    "missing_shards",
    "ekm_file",
    "ekm_file_sep",
    "dry_run",
    "extract_concurrency_max_limit",
    "create_concurrency_max_limit",
    *_IGNORED,
}
_SIZE = TypeAdapter(ByteSize)


@dataclass(frozen=True)
class Algorithm:
    kind: str = "alphanumeric"
    seed: str = ""
    decreasing: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "seed": self.seed, "decreasing": self.decreasing}


@dataclass(frozen=True)
class DsortSpec:
    input_bck: str
    output_bck: str
    output_format: str
    output_shard_size: int
    input_template: str | None = None
    input_objnames: tuple[str, ...] | None = None
    extension: str = ".tar"
    algorithm: Algorithm = field(default_factory=Algorithm)
    description: str = ""
    missing_shards: str = "ignore"
    extract_concurrency: int = 0  # 0: the job's default
    create_concurrency: int = 0

    # -- names ---------------------------------------------------------------------

    def input_names(self) -> list[str]:
        """Input shard object names, in input order (the ``none`` order)."""
        names = self.input_objnames
        if names is None:
            names = tuple(islice(braceexpand(str(self.input_template)), MAX_INPUT_SHARDS + 1))
        return [self._with_ext(n) for n in dict.fromkeys(names)]

    def output_names(self) -> Iterator[str]:
        """Output shard object names, first to last (runs out for a brace template)."""
        if "%" in self.output_format:
            i = 0
            while True:
                yield self._with_ext(self.output_format % i)
                i += 1
        else:
            for name in braceexpand(self.output_format):
                yield self._with_ext(name)

    def _with_ext(self, name: str) -> str:
        return name if name.endswith(self.extension) else name + self.extension

    # -- seeds and serialisation ------------------------------------------------------

    def with_seed(self) -> DsortSpec:
        """A shuffle without a seed gets a random one now, so every target uses the same."""
        if self.algorithm.kind != "shuffle" or self.algorithm.seed:
            return self
        return replace(self, algorithm=replace(self.algorithm, seed=secrets.token_hex(8)))

    def to_dict(self) -> dict[str, Any]:
        """The canonical spec: what targets receive and job status shows."""
        d: dict[str, Any] = {
            "extension": self.extension,
            "input_bck": {"name": self.input_bck, "provider": "ais"},
            "output_bck": {"name": self.output_bck, "provider": "ais"},
            "output_format": self.output_format,
            "output_shard_size": self.output_shard_size,
            "algorithm": self.algorithm.to_dict(),
            "description": self.description,
            "missing_shards": self.missing_shards,
            "extract_concurrency_max_limit": self.extract_concurrency,
            "create_concurrency_max_limit": self.create_concurrency,
        }
        if self.input_objnames is not None:
            d["input_format"] = {"objnames": list(self.input_objnames)}
        else:
            d["input_format"] = {"template": self.input_template}
        return d

    @classmethod
    def from_dict(cls, raw: Any) -> DsortSpec:
        return _parse(raw)


# -- parsing ---------------------------------------------------------------------------


def _parse(raw: Any) -> DsortSpec:
    if not isinstance(raw, dict):
        raise InvalidDsortSpec("spec", f"must be a JSON object, got {type(raw).__name__}")
    for key in raw:
        if key not in _KNOWN:
            raise InvalidDsortSpec(str(key), "unknown field (see docs/dsort.md for the fields)")
    for key, typ in _IGNORED.items():
        if key in raw and raw[key] is not None and not isinstance(raw[key], typ):
            raise InvalidDsortSpec(key, f"must be a {typ.__name__}")
    for key in ("ekm_file", "ekm_file_sep"):
        if raw.get(key):
            raise InvalidDsortSpec(key, "external key maps are not supported; use output_format")
    if raw.get("dry_run") not in (None, False):
        raise InvalidDsortSpec("dry_run", "dry runs are not supported; leave it out or false")

    ext = _extension(raw)
    if "bck" in raw and "input_bck" in raw:
        raise InvalidDsortSpec("bck", "give either bck or input_bck, not both")
    bck_key = "input_bck" if "input_bck" in raw else "bck"
    input_bck = _bucket(raw.get(bck_key), bck_key)
    output_bck = input_bck
    if raw.get("output_bck") is not None:
        output_bck = _bucket(raw["output_bck"], "output_bck")
    template, objnames = _input_format(raw.get("input_format"))
    spec = DsortSpec(
        input_bck=input_bck,
        output_bck=output_bck,
        input_template=template,
        input_objnames=objnames,
        output_format=_output_format(raw.get("output_format")),
        output_shard_size=_size(raw.get("output_shard_size")),
        extension=ext,
        algorithm=_algorithm(raw.get("algorithm")),
        description=_string(raw, "description"),
        missing_shards=_choice(raw, "missing_shards", MISSING_SHARDS, "ignore"),
        extract_concurrency=_limit(raw, "extract_concurrency_max_limit"),
        create_concurrency=_limit(raw, "create_concurrency_max_limit"),
    )
    _check_names(spec)
    return spec


def _string(raw: dict[str, Any], key: str, default: str = "") -> str:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidDsortSpec(key, f"must be a string, got {type(value).__name__}")
    return value


def _choice(raw: dict[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = _string(raw, key, default) or default
    if value not in choices:
        raise InvalidDsortSpec(key, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def _limit(raw: dict[str, Any], key: str) -> int:
    value = raw.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1024:
        raise InvalidDsortSpec(
            key, f"must be an integer from 0 (the default) to 1024, got {value!r}"
        )
    return value


def _extension(raw: dict[str, Any]) -> str:
    for key in ("extension", "input_extension", "output_extension"):
        value = _string(raw, key)
        if value and value not in (".tar", "tar"):
            raise InvalidDsortSpec(key, f"only .tar shards are supported, got {value!r}")
    return ".tar"


def _bucket(value: Any, key: str) -> str:
    name: Any
    if isinstance(value, str):
        name, provider = value, "ais"
    elif isinstance(value, dict):
        extra = set(value) - {"name", "provider", "namespace"}
        if extra:
            raise InvalidDsortSpec(f"{key}.{sorted(extra)[0]}", "unknown field")
        name = value.get("name")
        provider = value.get("provider") or "ais"
        if not isinstance(name, str) or not name:
            raise InvalidDsortSpec(f"{key}.name", "required: the bucket's name")
        ns = value.get("namespace")
        if ns not in (None, "") and ns != {"uuid": "", "name": ""}:
            raise InvalidDsortSpec(f"{key}.namespace", "namespaces are not supported")
    elif value is None:
        raise InvalidDsortSpec(f"{key}.name", "required: the bucket holding the shards")
    else:
        raise InvalidDsortSpec(key, 'must be {"name": ..., "provider": "ais"}')
    if provider != "ais":
        raise InvalidDsortSpec(
            f"{key}.provider",
            f"dsort reads and writes shards stored by Sluice ('ais'), not {provider!r}",
        )
    try:
        return validate_bucket(name)
    except InvalidName as e:
        raise InvalidDsortSpec(f"{key}.name", e.message) from None


def _input_format(value: Any) -> tuple[str | None, tuple[str, ...] | None]:
    key = "input_format"
    if isinstance(value, dict):
        extra = set(value) - {"template", "objnames"}
        if extra:
            raise InvalidDsortSpec(
                f"{key}.{sorted(extra)[0]}", "unknown field (template, objnames)"
            )
        if "objnames" in value and value["objnames"] is not None:
            names = value["objnames"]
            if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
                raise InvalidDsortSpec(f"{key}.objnames", "must be a list of object names")
            if not names:
                raise InvalidDsortSpec(f"{key}.objnames", "names no shard")
            return None, tuple(names)
        value, key = value.get("template"), f"{key}.template"
    if not isinstance(value, str) or not value:
        raise InvalidDsortSpec(key, 'required: a brace template such as "shard-{000..099}"')
    return value, None


def _output_format(value: Any) -> str:
    key = "output_format"
    if not isinstance(value, str) or not value:
        raise InvalidDsortSpec(key, 'required: a name such as "shuffled-%06d.tar"')
    if "%" in value:
        conversions = re.findall(r"%[^a-zA-Z%]*", value)
        if any(int(n) > 99 for c in conversions for n in re.findall(r"\d+", c)):
            raise InvalidDsortSpec(key, "a %d width or precision above 99 makes no object name")
        try:
            first, second = value % 0, value % 1
        except (TypeError, ValueError, OverflowError, MemoryError, KeyError) as e:
            raise InvalidDsortSpec(key, f"must take exactly one %d-style number ({e})") from None
        if first == second:
            raise InvalidDsortSpec(key, "must contain a %d-style number so shard names differ")
    elif "{" in value:
        names = list(islice(braceexpand(value), 2))
        if len(names) < 2 or names[0] == names[1]:
            raise InvalidDsortSpec(key, "the template must yield distinct names, e.g. {0000..9999}")
    else:
        raise InvalidDsortSpec(key, "needs a %d-style number or a {start..end} range")
    return value


def _size(value: Any) -> int:
    key = "output_shard_size"
    if value is None or value == "":
        raise InvalidDsortSpec(key, 'required: the size of each output shard, e.g. "100MB"')
    if isinstance(value, bool):
        raise InvalidDsortSpec(key, f"must be a size such as '100MB', got {value!r}")
    try:
        size = int(_SIZE.validate_python(value))
    except ValidationError:
        raise InvalidDsortSpec(key, f"must be a size such as '100MB', got {value!r}") from None
    if size < 1024:
        raise InvalidDsortSpec(key, f"must be at least 1KiB, got {size} bytes")
    return size


def _algorithm(value: Any) -> Algorithm:
    if value is None:
        return Algorithm()
    if not isinstance(value, dict):
        raise InvalidDsortSpec("algorithm", 'must be an object such as {"kind": "shuffle"}')
    for key in value:
        if key not in ("kind", "seed", "decreasing", "extension", "content_key_type"):
            raise InvalidDsortSpec(f"algorithm.{key}", "unknown field (kind, seed, decreasing)")
    kind = value.get("kind") or "alphanumeric"
    if kind == "content":
        raise InvalidDsortSpec(
            "algorithm.kind", "'content' is not supported; use shuffle, alphanumeric or none"
        )
    if kind not in KINDS:
        raise InvalidDsortSpec("algorithm.kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")
    for key in ("extension", "content_key_type"):
        if value.get(key):
            raise InvalidDsortSpec(f"algorithm.{key}", "only kind 'content' uses it (unsupported)")
    seed = value.get("seed")
    if seed is None:
        seed = ""
    if isinstance(seed, bool) or not isinstance(seed, str | int):
        got = type(seed).__name__
        raise InvalidDsortSpec("algorithm.seed", f"must be a string or an integer, got {got}")
    decreasing = value.get("decreasing", False)
    if not isinstance(decreasing, bool):
        raise InvalidDsortSpec("algorithm.decreasing", "must be true or false")
    return Algorithm(kind=kind, seed=str(seed), decreasing=decreasing)


def _check_names(spec: DsortSpec) -> None:
    names = spec.input_names()
    if len(names) > MAX_INPUT_SHARDS:
        raise InvalidDsortSpec("input_format", f"names more than {MAX_INPUT_SHARDS} shards")
    for name in names:
        try:
            validate_object(spec.input_bck, name)
        except InvalidName as e:
            raise InvalidDsortSpec("input_format", e.message) from None
    try:
        validate_object(spec.output_bck, next(spec.output_names()))
    except InvalidName as e:
        raise InvalidDsortSpec("output_format", e.message) from None
