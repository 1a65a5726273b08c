"""``Etl``: register user code as an ETL, wait for it to run, and manage its lifecycle.

Two ways to ship code, both ending in the shared ``EtlSpec``:

* ``init_code(transform=fn)``: ``fn`` is cloudpickled (base64) and tagged with
  this interpreter's ``major.minor``; the runtime refuses another version with a
  clear error. Functions from ``__main__`` or from modules that live outside
  site-packages (your scripts, notebooks, test files) are pickled *by value*,
  so the transformer does not need your source tree.
* ``init_spec(source=..., entrypoint=...)``: Python source text, portable across
  Python versions (what ``sluice etl init --code file.py:fn`` and kubectl use).
"""

from __future__ import annotations

import base64
import contextlib
import os
import sys
import sysconfig
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cloudpickle

from etl_runtime.core.spec import CodeSpec, EtlSpec, runtime_python_version
from etl_runtime.sdk.client import quote_path
from etl_runtime.sdk.errors import BadRequest, EtlError

if TYPE_CHECKING:
    from etl_runtime.sdk.client import Client

POLL_SECONDS = 0.2
# Each details request asks the gateway to answer as soon as the phase changes
# (``?wait=``), so Running is seen at once without polling; at most this long.
WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class EtlSummary:
    """One line of ``client.list_etls()``."""

    name: str
    phase: str
    mode: str
    ready: int
    total: int

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EtlSummary:
        return cls(
            name=str(d.get("name", "")),
            phase=str(d.get("phase", "")),
            mode=str(d.get("mode", "")),
            ready=int(d.get("ready") or 0),
            total=int(d.get("total") or 0),
        )


@dataclass(frozen=True)
class EtlDetails:
    """``GET /v1/etl/{name}``: phase, transformers per target, counters, last errors."""

    name: str
    phase: str
    message: str | None
    mode: str
    ready: int
    total: int
    uid: str | None = None
    transformers: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    last_errors: list[dict[str, Any]] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EtlDetails:
        return cls(
            name=str(d.get("name", "")),
            phase=str(d.get("phase", "")),
            message=d.get("message"),
            mode=str(d.get("mode") or (d.get("spec") or {}).get("mode") or ""),
            ready=int(d.get("ready") or 0),
            total=int(d.get("total") or 0),
            uid=d.get("uid"),
            transformers=list(d.get("transformers") or []),
            stats=dict(d.get("stats") or {}),
            last_errors=list(d.get("last_errors") or []),
            spec=dict(d.get("spec") or {}),
        )


def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple(os.path.realpath(paths[k]) for k in keys if k in paths)


def _is_local_module(module: types.ModuleType | None) -> bool:
    """True for user code that a transformer could not import by name."""
    if module is None or module.__name__ == "__main__":
        return False  # __main__ is pickled by value anyway
    top = module.__name__.split(".")[0]
    if top in sys.builtin_module_names or top == "etl_runtime":
        return False
    file = getattr(module, "__file__", None)
    if not file:
        return False
    real = os.path.realpath(file)
    return not any(real.startswith(root + os.sep) for root in _installed_roots())


def _local_modules_of(fn: Callable[..., Any]) -> set[str]:
    """``fn``'s own module plus local modules its globals point at."""
    names: set[str] = set()
    candidates = [sys.modules.get(getattr(fn, "__module__", "") or "")]
    for value in (getattr(fn, "__globals__", None) or {}).values():
        if isinstance(value, types.ModuleType):
            candidates.append(value)
        elif isinstance(value, type | types.FunctionType):
            candidates.append(sys.modules.get(value.__module__))
    for module in candidates:
        if _is_local_module(module):
            assert module is not None
            names.add(module.__name__)
    return names


@contextlib.contextmanager
def _pickled_by_value(module_names: Iterable[str]) -> Iterator[None]:
    registered = []
    try:
        for name in sorted(module_names):
            module = sys.modules[name]
            if not cloudpickle.cloudpickle._is_registered_pickle_by_value(module):
                cloudpickle.register_pickle_by_value(module)
                registered.append(module)
        yield
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def pickle_transform(fn: Callable[..., Any]) -> str:
    """``fn`` cloudpickled and base64-encoded, local modules included by value."""
    if not callable(fn):
        raise TypeError(f"transform must be callable, got {type(fn).__name__}")
    with _pickled_by_value(_local_modules_of(fn)):
        blob = cloudpickle.dumps(fn)
    return base64.b64encode(blob).decode("ascii")


class Etl:
    """A handle on one ETL by name; nothing is sent until you call a method."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name

    @property
    def _path(self) -> str:
        return f"/v1/etl/{quote_path(self.name)}"

    @property
    def _context(self) -> dict[str, str | None]:
        return {"etl": self.name}

    def init_code(
        self,
        transform: Callable[..., Any],
        mode: str = "object",
        decode: str | None = None,
        on_error: str = "fail",
        dependencies: Iterable[str] = (),
        workers: int | None = None,
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
        arg_type: str = "",
        wait: bool = True,
        cache: bool = False,
    ) -> EtlDetails:
        """Register ``transform`` (pickled) and wait until every transformer runs.

        ``mode="object"``: ``fn(data: bytes[, args: str]) -> bytes``;
        ``mode="wds"``: ``fn(sample: dict) -> dict | None`` per WebDataset sample.
        ``cache=True``: each target keeps the transformed objects it served and
        answers the next GET of the same object, ETL version and ``etl_args``
        from disk without running ``fn`` (only for deterministic functions).
        Raises ``EtlError`` if the ETL goes to phase Error or is not Running
        after ``timeout`` seconds.
        """
        pickled = pickle_transform(transform)
        code = CodeSpec(pickled=pickled, python_version=runtime_python_version())
        return self._init(
            code, mode, decode, on_error, dependencies, workers, timeout, env, arg_type, wait, cache
        )

    def init_spec(
        self,
        source: str,
        entrypoint: str = "transform",
        mode: str = "object",
        decode: str | None = None,
        on_error: str = "fail",
        dependencies: Iterable[str] = (),
        workers: int | None = None,
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
        arg_type: str = "",
        wait: bool = True,
        cache: bool = False,
    ) -> EtlDetails:
        """Register Python ``source`` whose ``entrypoint`` is the transform (``cache``:
        as for ``init_code``)."""
        code = CodeSpec(source=source, entrypoint=entrypoint)
        return self._init(
            code, mode, decode, on_error, dependencies, workers, timeout, env, arg_type, wait, cache
        )

    def init_image(
        self,
        image: str,
        command: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        wait: bool = True,
    ) -> EtlDetails:
        """Run ``image``, an AIStore-style ETL server (``GET /health`` and ``PUT
        /<bucket>/<object>`` on port 8000), as the transformer (``spec.commType``
        ``hpush://``): a pod beside each target, or a podman container under ``sluice up``."""
        spec = EtlSpec(
            comm_type="hpush://",
            image=image,
            command=tuple(command),
            env=tuple(sorted((str(k), str(v)) for k, v in (env or {}).items())),
        )
        return self._put(spec, timeout, wait)

    def _init(
        self,
        code: CodeSpec,
        mode: str,
        decode: str | None,
        on_error: str,
        dependencies: Iterable[str],
        workers: int | None,
        timeout: float,
        env: Mapping[str, str] | None,
        arg_type: str,
        wait: bool,
        cache: bool = False,
    ) -> EtlDetails:
        spec = EtlSpec(
            mode=mode,
            code=code,
            decode=decode,
            on_error=on_error,
            dependencies=tuple(dependencies),
            workers=workers,
            arg_type=arg_type,
            env=tuple(sorted((str(k), str(v)) for k, v in (env or {}).items())),
            cache=cache,
        )
        return self._put(spec, timeout, wait)

    def _put(self, spec: EtlSpec, timeout: float, wait: bool) -> EtlDetails:
        # Validation is the gateway's job: a bad spec comes back as BadRequest (400).
        data = self.client.request_json(
            "PUT",
            "/v1/etl",
            json_body={"name": self.name, "spec": spec.to_dict()},
            context=self._context,
        )
        details = EtlDetails.from_dict(data)
        return self.wait_until_running(timeout) if wait else details

    def wait_until_running(self, timeout: float = 120.0) -> EtlDetails:
        """Wait until phase Running; ``EtlError`` on phase Error or after ``timeout``."""
        deadline = time.monotonic() + timeout
        longest = min(WAIT_SECONDS, self.client.timeout / 2)  # the answer must beat the timeout
        long_polls = True
        while True:
            left = deadline - time.monotonic()
            try:
                details = self.details(wait=max(0.0, min(longest, left)) if long_polls else None)
            except BadRequest as e:
                if not long_polls or "wait" not in str(e):
                    raise
                long_polls = False  # a gateway older than ?wait= refuses it: poll instead
                continue
            if not long_polls and details.phase == "Initializing":
                time.sleep(POLL_SECONDS)
            if details.phase == "Running":
                return details
            if details.phase == "Error":
                raise EtlError(
                    details.message or f"ETL {self.name!r} failed to start",
                    etl=self.name,
                    phase=details.phase,
                )
            if time.monotonic() >= deadline:
                raise EtlError(
                    f"ETL {self.name!r} not Running after {timeout:g}s: phase "
                    f"{details.phase}, {details.ready}/{details.total} transformers ready"
                    + (f" ({details.message})" if details.message else ""),
                    etl=self.name,
                    phase=details.phase,
                )
            if details.phase != "Initializing":
                time.sleep(POLL_SECONDS)  # Stopped, or a phase this SDK does not know

    def details(self, wait: float | None = None) -> EtlDetails:
        """Phase, transformers, counters; ``wait``: the gateway answers once the ETL
        leaves Initializing, or after that many seconds (30 at most)."""
        params = None if wait is None else {"wait": f"{wait:.3f}"}
        return EtlDetails.from_dict(
            self.client.request_json("GET", self._path, params=params, context=self._context)
        )

    def stop(self) -> EtlDetails:
        """Stop the transformers; GETs through this ETL answer 409 until ``start()``."""
        path = f"{self._path}/stop"
        return EtlDetails.from_dict(self.client.request_json("POST", path, context=self._context))

    def start(self, wait: bool = True, timeout: float = 120.0) -> EtlDetails:
        """Start a stopped ETL and wait (like ``init_code``) until it is Running.

        ``EtlError`` on phase Error or after ``timeout`` seconds; ``wait=False``
        returns the details at once (GETs answer 503 until the ETL is Running).
        """
        path = f"{self._path}/start"
        details = EtlDetails.from_dict(
            self.client.request_json("POST", path, context=self._context)
        )
        return self.wait_until_running(timeout) if wait else details

    def delete(self) -> None:
        self.client.request("DELETE", self._path, context=self._context)

    def logs(self, tail: int = 200) -> dict[str, str]:
        """Recent log lines of each transformer, by target id."""
        data = self.client.request_json(
            "GET", f"{self._path}/logs", params={"tail": str(tail)}, context=self._context
        )
        return {str(k): str(v) for k, v in (data.get("logs") or {}).items()}

    def __repr__(self) -> str:
        return f"Etl({self.name!r})"
