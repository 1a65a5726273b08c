"""The ETL specification: one schema shared by every part of Sluice.

The same camelCase document is the ``spec`` of the ``ETL`` custom resource, the
``spec`` of ``PUT /v1/etl`` on the gateway, the JSON the local cluster stores,
and what a transformer receives in ``SLUICE_ETL_SPEC``. ``EtlSpec`` parses and
validates it once; everything else passes ``EtlSpec`` objects around.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from etl_runtime.core.errors import InvalidSpec

MODES = ("object", "wds")
ON_ERROR = ("fail", "skip")
ARG_TYPES = ("", "fqn")
# ``commType``: how targets talk to a transformer that is a user's own container
# image (``spec.image``) speaking AIStore's ETL protocol instead of Sluice's runtime
# (``etl/aisimage.py``). "" (default): Sluice's runtime runs ``spec.code``.
COMM_TYPES = ("", "hpush://")
# The default per-object limit: well past any single-object transform a training
# loader waits for (a DataLoader worker blocks on it), short enough that a hung
# ETL frees its worker in minutes, not ten (issue 20 #8).
REQUEST_SECONDS = 120.0
# A transformer's answers carry the content_hash() of the spec it runs: a target's
# output cache (etl/outcache.py) keeps an answer only under the generation that made it.
SPEC_HASH_HEADER = "X-Sluice-Spec-Hash"
# A wds answer asked with ``etl_skip=K`` says how many samples it left out and the
# key of the last of them (percent-encoded), so a reader can check it resumes
# where it stopped (webserver/shards.py, pytorch/shards.py).
SKIPPED_HEADER = "X-Sluice-Etl-Skipped"
SKIPPED_KEY_HEADER = "X-Sluice-Etl-Skipped-Key"
SKIPPED_HEADERS = (SKIPPED_HEADER, SKIPPED_KEY_HEADER)
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,51}[a-z0-9])?$")
# Files a local cluster keeps beside the ETL records (``DIR/etl/<name>.json``): the S3
# API's keys (gateway/s3/keys.py) and the ETLs' uids (local/runas.py). No ETL takes
# their names, so none overwrites them and neither is read as an ETL's record.
RESERVED_NAMES = frozenset({"s3-keys", "etl-uids"})


def runtime_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):  # `$` allows "a\n"
        raise InvalidSpec(
            f"invalid ETL name {name!r}: use 1-53 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit"
        )
    if name in RESERVED_NAMES:
        raise InvalidSpec(
            f"ETL name {name!r} is reserved (a local cluster keeps its "
            f"{name}.json beside the ETLs' records); pick another"
        )
    return name


def _typed(d: dict[str, Any], key: str, types: type | tuple[type, ...], path: str) -> Any:
    """``d[key]`` if it is absent/null or of ``types`` (bool is no number); else InvalidSpec."""
    value = d.get(key)
    if value is None:
        return None
    number = types in (int, float) or types == (int, float)
    if not isinstance(value, types) or (number and isinstance(value, bool)):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        kind = {"str": "a string", "dict": "an object", "list": "a list", "bool": "true/false"}
        kind["int or float"] = "a number"
        raise InvalidSpec(f"{path}.{key} must be {kind.get(names, names)}, got {value!r:.80}")
    return value


def _seconds(timeouts: dict[str, Any], key: str, default: float) -> float:
    value = _typed(timeouts, key, (int, float), "spec.timeouts")
    if value is None:
        return default
    if not 0 < value < 1e9:
        raise InvalidSpec(f"spec.timeouts.{key} must be a positive number, got {value!r}")
    return float(value)


def _env(value: Any) -> tuple[tuple[str, str], ...]:
    if isinstance(value, list):  # Kubernetes style [{name, value}]
        if not all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in value):
            raise InvalidSpec("spec.env as a list must hold {'name': str, 'value': str} objects")
        value = {e["name"]: e.get("value", "") for e in value}
    if not isinstance(value, dict):
        raise InvalidSpec(f"spec.env must be an object of name: value, got {value!r:.80}")
    if not all(isinstance(v, str | int | float | bool) for v in value.values()):
        raise InvalidSpec("spec.env values must be strings")
    return tuple(sorted((str(k), str(v)) for k, v in value.items()))


CODE_KINDS = ("pickled", "source", "aisClass")


@dataclass(frozen=True)
class CodeSpec:
    """User code: a cloudpickled callable (base64), Python source + entrypoint, or
    ``aisClass``: a cloudpickled AIStore ``ETLServer`` subclass (base64), as the
    official aistore SDK's ``init_class`` sends it (``gateway/aisetl.py``)."""

    pickled: str | None = None
    python_version: str | None = None
    source: str | None = None
    entrypoint: str = "transform"
    ais_class: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entrypoint": self.entrypoint}
        if self.pickled is not None:
            out["pickled"] = self.pickled
        if self.ais_class is not None:
            out["aisClass"] = self.ais_class
        if self.pickled is not None or self.ais_class is not None:
            out["pythonVersion"] = self.python_version
        if self.source is not None:
            out["source"] = self.source
        return out


@dataclass(frozen=True)
class EtlSpec:
    mode: str = "object"
    code: CodeSpec = field(default_factory=CodeSpec)
    decode: str | None = None
    on_error: str = "fail"
    dependencies: tuple[str, ...] = ()
    workers: int | None = None
    arg_type: str = ""
    env: tuple[tuple[str, str], ...] = ()
    init_timeout_seconds: float = 300.0
    request_timeout_seconds: float = REQUEST_SECONDS
    stopped: bool = False
    # Keep transformed answers on the target (etl/outcache.py); the transform must be
    # deterministic: same object, spec and etl_args -> same bytes.
    cache: bool = False
    # Kubernetes-only knobs, carried through untouched by the local cluster.
    image: str | None = None
    resources: dict[str, Any] | None = None
    target_selector: dict[str, str] | None = None
    # An AIStore-style ETL image: ``image`` is the transformer itself, started with
    # ``command`` (default: the image's own), spoken to with ``comm_type``.
    comm_type: str = ""
    command: tuple[str, ...] = ()

    @property
    def foreign(self) -> bool:
        """The transformer is the user's own image (AIStore's protocol), not Sluice's runtime."""
        return bool(self.comm_type)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EtlSpec:
        if not isinstance(d, dict):
            raise InvalidSpec("ETL spec must be a JSON object")
        code_d = d.get("code") or {}
        if not isinstance(code_d, dict):
            raise InvalidSpec("spec.code must be an object with 'pickled' or 'source'")
        code = CodeSpec(
            pickled=_typed(code_d, "pickled", str, "spec.code"),
            python_version=_typed(code_d, "pythonVersion", str, "spec.code"),
            source=_typed(code_d, "source", str, "spec.code"),
            entrypoint=_typed(code_d, "entrypoint", str, "spec.code") or "transform",
            ais_class=_typed(code_d, "aisClass", str, "spec.code"),
        )
        timeouts = _typed(d, "timeouts", dict, "spec") or {}
        deps = _typed(d, "dependencies", list, "spec") or ()
        selector = _typed(d, "targetSelector", dict, "spec")
        command = _typed(d, "command", list, "spec") or ()
        if not all(isinstance(c, str) for c in command):
            raise InvalidSpec("spec.command must be a list of strings")
        if selector is not None and not all(isinstance(v, str) for v in selector.values()):
            raise InvalidSpec("spec.targetSelector must map label names to strings")
        spec = cls(
            mode=_typed(d, "mode", str, "spec") or "object",
            code=code,
            decode=_typed(d, "decode", str, "spec") or None,
            on_error=_typed(d, "onError", str, "spec") or "fail",
            dependencies=tuple(deps),
            workers=d.get("workers"),
            arg_type=_typed(d, "argType", str, "spec") or "",
            env=_env(d.get("env") or {}),
            init_timeout_seconds=_seconds(timeouts, "initSeconds", 300.0),
            request_timeout_seconds=_seconds(timeouts, "requestSeconds", REQUEST_SECONDS),
            stopped=bool(_typed(d, "stopped", bool, "spec")),
            cache=bool(_typed(d, "cache", bool, "spec")),
            image=_typed(d, "image", str, "spec"),
            resources=_typed(d, "resources", dict, "spec"),
            target_selector=selector,
            comm_type=_typed(d, "commType", str, "spec") or "",
            command=tuple(command),
        )
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.mode not in MODES:
            raise InvalidSpec(f"spec.mode must be one of {MODES}, got {self.mode!r}")
        if self.on_error not in ON_ERROR:
            raise InvalidSpec(f"spec.onError must be one of {ON_ERROR}, got {self.on_error!r}")
        if self.arg_type not in ARG_TYPES:
            raise InvalidSpec(f"spec.argType must be one of {ARG_TYPES}, got {self.arg_type!r}")
        if self.comm_type not in COMM_TYPES:
            raise InvalidSpec(
                f"spec.commType must be one of {COMM_TYPES} (hpush://: spec.image is an "
                f"AIStore-style ETL server), got {self.comm_type!r}"
            )
        if self.foreign:
            self._validate_foreign()
            return
        if self.command:
            raise InvalidSpec(
                "spec.command is for an AIStore-style ETL image (spec.commType hpush://); "
                "Sluice's runtime image is started by the operator"
            )
        code = self.code
        kinds = [
            k
            for k, v in zip(CODE_KINDS, (code.pickled, code.source, code.ais_class), strict=True)
            if v is not None
        ]
        if len(kinds) != 1:
            got = f"; got {' and '.join(kinds)}" if kinds else ""
            raise InvalidSpec(
                "spec.code needs exactly one of 'pickled' or 'source' "
                f"(or 'aisClass', an AIStore ETL class){got}"
            )
        if kinds[0] != "source" and not code.python_version:
            raise InvalidSpec(f"spec.code.pythonVersion is required with spec.code.{kinds[0]}")
        if code.ais_class is not None and self.mode != "object":
            raise InvalidSpec(
                "spec.code.aisClass (an AIStore ETL class) runs in mode 'object' only"
            )
        bad_workers = not isinstance(self.workers, int) or isinstance(self.workers, bool)
        if self.workers is not None and (bad_workers or not 1 <= self.workers <= 1024):
            raise InvalidSpec(f"spec.workers must be a positive integer, got {self.workers!r}")
        if not isinstance(self.cache, bool):
            raise InvalidSpec(f"spec.cache must be true/false, got {self.cache!r:.80}")
        if any(not isinstance(r, str) or not r.strip() for r in self.dependencies):
            raise InvalidSpec("spec.dependencies must be a list of pip requirement strings")

    def _validate_foreign(self) -> None:
        """An image that is its own transformer: no Sluice code, nothing Sluice's runtime does."""
        if not self.image:
            raise InvalidSpec(
                f"spec.commType {self.comm_type} needs spec.image: the container image "
                "that serves AIStore's ETL protocol (PUT /<bucket>/<object>, GET /health)"
            )
        code = self.code
        given = [
            k
            for k, v in zip(CODE_KINDS, (code.pickled, code.source, code.ais_class), strict=True)
            if v is not None
        ]
        unused = [f"code.{k}" for k in given]
        for name, value in (
            ("mode", self.mode != "object"),
            ("decode", self.decode),
            ("onError", self.on_error != "fail"),
            ("dependencies", self.dependencies),
            ("workers", self.workers is not None),
            ("argType", self.arg_type),
            ("cache", self.cache),
        ):
            if value:
                unused.append(name)
        if unused:
            raise InvalidSpec(
                f"spec.{unused[0]} does not apply to an AIStore-style ETL image "
                f"(spec.commType {self.comm_type}): the image is the whole transformer, "
                "one object in, one out, with what it installed at build time"
            )

    def to_dict(self) -> dict[str, Any]:
        if self.foreign:
            return self._foreign_dict()
        out: dict[str, Any] = {
            "mode": self.mode,
            "code": self.code.to_dict(),
            "onError": self.on_error,
            "dependencies": list(self.dependencies),
            "argType": self.arg_type,
            "env": dict(self.env),
            "timeouts": {
                "initSeconds": self.init_timeout_seconds,
                "requestSeconds": self.request_timeout_seconds,
            },
            "stopped": self.stopped,
        }
        if self.cache:  # absent when off: specs written before it read the same
            out["cache"] = True
        for key, value in (
            ("decode", self.decode),
            ("workers", self.workers),
            ("image", self.image),
            ("resources", self.resources),
            ("targetSelector", self.target_selector),
        ):
            if value is not None:
                out[key] = value
        return out

    def _foreign_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode,
            "commType": self.comm_type,
            "image": self.image,
            "env": dict(self.env),
            "timeouts": {
                "initSeconds": self.init_timeout_seconds,
                "requestSeconds": self.request_timeout_seconds,
            },
            "stopped": self.stopped,
        }
        if self.command:
            out["command"] = list(self.command)
        for key, value in (("resources", self.resources), ("targetSelector", self.target_selector)):
            if value is not None:
                out[key] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def content_hash(self) -> str:
        """Hash of everything that shapes a running transformer (not ``stopped``, nor
        ``cache``, which only the targets read: turning it on or off rolls nothing)."""
        d = self.to_dict()
        d.pop("stopped", None)
        d.pop("cache", None)
        blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
