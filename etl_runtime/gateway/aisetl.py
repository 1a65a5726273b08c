"""AIStore's ETL init message on ``PUT /v1/etl``, as a Sluice ``EtlSpec``.

The official aistore SDK (2.0) creates an ETL with ``PUT /v1/etl`` and the body
(``ETLSpecMsg``)::

    {"name", "communication": "hpush://", "init_timeout": "5m", "obj_timeout": "45s",
     "support_direct_put": true, "runtime": {"image", "command"?, "env"?: [{name, value}]}}

Sluice's own body is ``{"name", "spec": {...}}``; ``is_ais_message`` tells the two
apart by shape (a ``spec`` object is Sluice's), and a body mixing them, or with a
field neither has, is a 400 naming the field.

``init_class`` sends the image ``aistorage/runtime_python:<major.minor>`` and its
settings as env vars: ``ETL_CLASS_PAYLOAD`` (the cloudpickled ``ETLServer``
subclass) becomes ``spec.code.aisClass`` with that ``pythonVersion``, run by
Sluice's own runtime (``webserver/aisclass.py``); ``PACKAGES`` →
``spec.dependencies``; ``NUM_WORKERS`` → ``spec.workers``; ``ETL_DIRECT_FQN`` →
``argType: fqn`` (and stays in the env: the class then gets the file's path);
``init_timeout``/``obj_timeout`` → ``timeouts.initSeconds``/``requestSeconds``;
``argument: fqn`` → ``argType: fqn``; ``resources`` → ``spec.resources``; other
env vars → ``spec.env``. ``communication`` and ``support_direct_put`` are
accepted and change nothing: Sluice's transformer is always handed the object
(or its file) by the target, and bucket-to-bucket jobs always write directly.

``init(image=...)`` (no class payload): the image is the transformer, spoken to
with AIStore's hpush protocol: ``spec.commType: hpush://``, ``spec.image``,
``runtime.command`` → ``spec.command``, every env var → ``spec.env`` (the image
reads its own settings); ``etl/aisimage.py`` (targets), ``local/containers.py``
(podman), the operator (a pod). ``hpull://``/``ws://`` and ``argument: fqn`` are
400s with an image: targets push the object's bytes.

Refused with a 400 that says why: ``OS_PACKAGES`` (nothing installs OS packages
into a transformer), AIStore 1.x messages (``code``, ``spec`` as a pod spec).

AIStore's init answers once the ETL runs, with its job id as text; so does this
one (``wait_running``): a failure to start (the class does not load, another
Python, a dependency that does not install) is a 400 ``EtlInitFailed`` with the
transformer's reason.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from etl_runtime.cluster.records import EtlBackend, EtlRecord
from etl_runtime.core.errors import EtlInitFailed, EtlNotFound, InvalidSpec
from etl_runtime.core.spec import EtlSpec, validate_name

FIELDS = (
    "name",
    "communication",
    "init_timeout",
    "obj_timeout",
    "support_direct_put",
    "runtime",
    "env",
    "resources",
    "argument",
)
RUNTIME_FIELDS = ("image", "command", "env")
COMM_TYPES = ("hpush", "hpull", "ws")
# AIStore 1.x: init_code (code, runtime "python3.11v2", dependencies, ...) and
# init_spec (spec: a base64 pod spec). Named so the refusal says what they are.
OLD_FIELDS = ("code", "spec", "timeout", "chunk_size", "dependencies", "arg_type", "funcs")
CLASS_ENV, PACKAGES_ENV, OS_PACKAGES_ENV = "ETL_CLASS_PAYLOAD", "PACKAGES", "OS_PACKAGES"
WORKERS_ENV, DIRECT_FQN_ENV = "NUM_WORKERS", "ETL_DIRECT_FQN"
RUNTIME_IMAGE = re.compile(r"(?:^|/)runtime_python:(\d+\.\d+)(?![0-9])")
DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h|d)")
ANY_DURATION = re.compile(rf"(?:{DURATION.pattern})+")
# "d" is not Go's, but the SDK's own convert_to_seconds takes it
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
UNITS["d"] = 86400
TRUE = ("true", "1", "yes", "y", "on")
# How often an AIStore init re-reads the ETL's record while it starts: an in-memory
# lookup (local) or a watch cache (Kubernetes), so Running is answered within 20 ms.
POLL_SECONDS = 0.02
ANSWER_MARGIN = 5.0  # answer before the SDK's own request timeout (= init_timeout)
START_WAIT = 290.0  # the SDK's start() times out after 5 minutes


def is_ais_message(body: dict[str, Any]) -> bool:
    """AIStore's init message rather than Sluice's ``{"name", "spec": {...}}``."""
    if isinstance(body.get("spec"), dict):
        extra = sorted(set(body) - {"name", "spec"})
        if extra:
            ais = [k for k in extra if k in FIELDS]
            what = "AIStore's init field(s)" if ais else "unknown field(s)"
            raise InvalidSpec(
                f"{what} {', '.join(extra)} beside Sluice's 'spec': send either Sluice's "
                '{"name", "spec": {...}} or AIStore\'s init message, not both',
                etl=_name_of(body),
            )
        return False
    return bool(set(body) - {"name", "spec"}) or isinstance(body.get("spec"), str)


def _name_of(body: dict[str, Any]) -> str | None:
    name = body.get("name")
    return name if isinstance(name, str) else None


def _bad(field: str, why: str, name: str | None) -> InvalidSpec:
    return InvalidSpec(f"AIStore ETL init message: {field}: {why}", etl=name)


def _seconds(body: dict[str, Any], field: str, name: str | None) -> float | None:
    """A Go duration ("5m", "45s", "1m30s") in seconds; None when absent. A bare
    number is refused: seconds to the SDK, nanoseconds to Go."""
    value = body.get(field)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not ANY_DURATION.fullmatch(value.strip()):
        raise _bad(field, f"must be a duration such as '5m' or '45s', got {value!r:.60}", name)
    total = sum(float(n) * UNITS[u] for n, u in DURATION.findall(value))
    if not 0 < total < 1e9:
        raise _bad(field, f"must be a positive duration, got {value!r:.60}", name)
    return total


def _env(entries: Any, field: str, name: str | None) -> dict[str, str]:
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise _bad(field, "must be a list of {'name': ..., 'value': ...}", name)
    out: dict[str, str] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"]:
            raise _bad(f"{field}[{i}]", "must be {'name': str, 'value': str}", name)
        extra = sorted(set(e) - {"name", "value"})
        if extra:
            raise _bad(f"{field}[{i}].{extra[0]}", "is not supported (only name and value)", name)
        value = e.get("value", "")
        if not isinstance(value, str | int | float | bool) and value is not None:
            raise _bad(f"{field}[{i}].value", f"must be a string, got {value!r:.60}", name)
        out[e["name"]] = "" if value is None else str(value)
    return out


def _refuse_old(body: dict[str, Any], name: str | None) -> None:
    if isinstance(body.get("runtime"), str) or "code" in body:
        raise _bad(
            "code" if "code" in body else "runtime",
            "this is AIStore 1.x's init_code, which Sluice does not take; use the aistore "
            "SDK 2.x's init_class (an ETLServer subclass) or Sluice's own SDK init_code",
            name,
        )
    if isinstance(body.get("spec"), str):
        raise _bad(
            "spec",
            "this is AIStore 1.x's init_spec (a whole pod spec), which Sluice does not take: "
            "use init(image=...) (Sluice makes the pod), init_class (an ETLServer subclass, "
            "run in Sluice's runtime) or Sluice's own spec",
            name,
        )
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        old = unknown[0] in OLD_FIELDS
        why = (
            "a field of AIStore 1.x's init messages, which Sluice does not take"
            if old
            else ("unknown field")
        )
        raise _bad(unknown[0], f"{why} (AIStore 2.x's are {', '.join(FIELDS)})", name)


def _image_spec(
    body: dict[str, Any], name: str | None, image: str, env: dict[str, str], command: Any
) -> dict[str, Any]:
    """``init(image=...)``: the user's image is the transformer and speaks hpush
    (``spec.commType``; ``etl/aisimage.py``). hpull/ws would have the image fetch the
    object from the target (``AIS_TARGET_URL``), which Sluice's targets do not serve."""
    comm = str(body.get("communication") or "hpush://")
    if comm.removesuffix("://") != "hpush":
        raise _bad(
            "communication",
            f"{comm!r} with an ETL image: Sluice's targets speak hpush:// to ETL images "
            "(they PUT the object to the image's server); use comm_type='hpush'",
            name,
        )
    if body.get("argument") == "fqn":
        raise _bad(
            "argument",
            "'fqn' with an ETL image: Sluice's targets push the object's bytes to an ETL "
            "image (its server reads the body when no etl_fqn is given); leave it out",
            name,
        )
    if command is not None and (
        not isinstance(command, list) or not all(isinstance(c, str) for c in command)
    ):
        raise _bad("runtime.command", "must be a list of strings", name)
    spec: dict[str, Any] = {"commType": "hpush://", "image": image, "env": env}
    if command:
        spec["command"] = command
    return spec


def to_spec(body: dict[str, Any], platform: str = "local") -> tuple[str, EtlSpec]:
    """``(name, spec)`` of AIStore's init message; ``InvalidSpec`` naming the field."""
    name = _name_of(body)
    validate_name(body.get("name"))  # type: ignore[arg-type]
    _refuse_old(body, name)
    comm = body.get("communication")
    if comm is not None and (
        not isinstance(comm, str) or comm.removesuffix("://") not in ("", *COMM_TYPES)
    ):
        raise _bad("communication", f"must be one of hpush://, hpull://, ws://, got {comm!r}", name)
    direct_put = body.get("support_direct_put")
    if direct_put is not None and not isinstance(direct_put, bool):
        raise _bad("support_direct_put", f"must be true or false, got {direct_put!r}", name)
    argument = body.get("argument")
    if argument not in (None, "", "fqn"):
        raise _bad("argument", f"must be '' or 'fqn', got {argument!r:.60}", name)
    resources = body.get("resources")
    if resources is not None and not isinstance(resources, dict):
        raise _bad("resources", "must be an object (requests, limits)", name)
    runtime = body.get("runtime")
    if not isinstance(runtime, dict):
        raise _bad("runtime", "must be an object {image, command?, env?}", name)
    extra = sorted(set(runtime) - set(RUNTIME_FIELDS))
    if extra:
        raise _bad(f"runtime.{extra[0]}", "unknown field (known: image, command, env)", name)
    image = runtime.get("image")
    if not isinstance(image, str) or not image:
        raise _bad("runtime.image", "must be a non-empty string", name)
    env = _env(body.get("env"), "env", name) | _env(runtime.get("env"), "runtime.env", name)
    if env.get(OS_PACKAGES_ENV, "").strip():
        raise _refuse_os_packages(env[OS_PACKAGES_ENV], name, platform)
    payload = env.pop(CLASS_ENV, None)
    timeouts = {
        k: v
        for k, v in (
            ("initSeconds", _seconds(body, "init_timeout", name)),
            ("requestSeconds", _seconds(body, "obj_timeout", name)),
        )
        if v is not None
    }
    if not payload:
        by_image = _image_spec(body, name, image, env, runtime.get("command"))
        return _spec(body, name, by_image | {"timeouts": timeouts}, resources)
    version = RUNTIME_IMAGE.search(image)
    if version is None:
        raise _bad(
            "runtime.image",
            f"with {CLASS_ENV} (init_class) it must be aistorage/runtime_python:<major.minor>, "
            f"which names the Python that pickled the class; got {image!r}",
            name,
        )
    if runtime.get("command"):
        raise _bad(
            "runtime.command",
            "is not used with init_class: Sluice's runtime serves the class itself",
            name,
        )
    env.pop(OS_PACKAGES_ENV, None)
    packages = env.pop(PACKAGES_ENV, "")
    workers = _workers(env.pop(WORKERS_ENV, None), name)
    direct_fqn = env.get(DIRECT_FQN_ENV, "").strip().lower() in TRUE
    spec: dict[str, Any] = {
        "mode": "object",
        "code": {"aisClass": payload, "pythonVersion": version.group(1)},
        "dependencies": [p.strip() for p in packages.split(",") if p.strip()],
        "argType": "fqn" if direct_fqn or argument == "fqn" else "",
        "env": env,
        "timeouts": timeouts,
    }
    if workers is not None:
        spec["workers"] = workers
    return _spec(body, name, spec, resources)


def _spec(
    body: dict[str, Any], name: str | None, spec: dict[str, Any], resources: Any
) -> tuple[str, EtlSpec]:
    if resources is not None:
        spec["resources"] = resources
    try:
        return body["name"], EtlSpec.from_dict(spec)
    except InvalidSpec as e:
        raise InvalidSpec(f"AIStore ETL init message: {e}", etl=name) from None


def _workers(value: str | None, name: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        workers = int(value)
    except ValueError:
        workers = 0
    if not 1 <= workers <= 1024:
        raise _bad(f"env {WORKERS_ENV}", f"must be a number of workers 1-1024, got {value!r}", name)
    return workers


def _refuse_os_packages(packages: str, name: str | None, platform: str) -> InvalidSpec:
    if platform == "kubernetes":
        why = (
            "Sluice's transformer pods run its runtime image as a non-root user and install "
            "no OS packages; build an image FROM Sluice's runtime with them installed and "
            "set it as spec.image of a Sluice spec"
        )
    else:
        why = (
            "a local cluster (sluice up) runs transformers as processes of this machine, "
            "which cannot install OS packages; install them on this machine and leave "
            "os_packages out"
        )
    return _bad(f"os_packages (env {OS_PACKAGES_ENV}={packages!r:.80})", why, name)


async def wait_running(backend: EtlBackend, name: str, seconds: float) -> EtlRecord:
    """The record once the ETL runs (or is stopped); ``EtlInitFailed`` on phase
    Error or after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(1.0, seconds)
    while True:
        record = await backend.get(name)
        if record is None:
            raise EtlNotFound(f"ETL {name!r} was deleted while it started", etl=name)
        if record.phase == "Running" or (record.phase == "Stopped" and record.spec.stopped):
            return record
        if record.phase == "Error":
            raise EtlInitFailed(f"ETL {name!r} failed to start: {record.message}", etl=name)
        if loop.time() >= deadline:
            why = sorted({t.message for t in record.transformers if not t.ready and t.message})
            raise EtlInitFailed(
                f"ETL {name!r} is not running after {seconds:g}s: phase {record.phase}, "
                f"{record.ready_count}/{len(record.transformers)} transformers ready"
                + (f" ({record.message})" if record.message else "")
                + (f"; transformers: {'; '.join(why)[:1000]}" if why else "")
                + f"; it goes on starting: see GET /v1/etl/{name}",
                etl=name,
            )
        await asyncio.sleep(POLL_SECONDS)


def init_wait(spec: EtlSpec) -> float:
    """How long an AIStore init waits for its ETL: a little less than the SDK does."""
    return max(1.0, spec.init_timeout_seconds - ANSWER_MARGIN)
