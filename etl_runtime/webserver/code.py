"""Turning ``spec.code`` and ``spec.dependencies`` into a callable (an AIStore ETL
class, ``spec.code.aisClass``, into an ``aisclass.AisClassHandler``).

Runs in every worker process (``load_transform``) and once in the server before
the workers start (``check_code`` for a fast, clear refusal of a Python version
mismatch, and ``install_dependencies``). Failures are ``StartupError``s: the
transformer exits with code 2 and a one-line reason.
"""

from __future__ import annotations

import base64
import inspect
import os
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

from etl_runtime.core.errors import CodeLoadError, DependencyError, PythonVersionMismatch
from etl_runtime.core.spec import EtlSpec, runtime_python_version
from etl_runtime.webserver.aisclass import load_class

USER_MODULE = "sluice_user_code"


def check_code(spec: EtlSpec) -> None:
    """Refuse code this runtime cannot load, before any worker starts."""
    code = spec.code
    runs = runtime_python_version()
    if code.ais_class is not None and code.python_version != runs:
        raise PythonVersionMismatch(
            f"the ETL class was pickled with Python {code.python_version} (init_class asked "
            f"for aistorage/runtime_python:{code.python_version}) but this transformer runs "
            f"Python {runs}; a pickled class only loads on the Python that pickled it: call "
            f"init_class from Python {runs}, or run Sluice's runtime image built for "
            f"Python {code.python_version}"
        )
    if code.pickled is not None and code.python_version != runs:
        raise PythonVersionMismatch(
            f"code was pickled with Python {code.python_version} but this transformer "
            f"runs Python {runtime_python_version()}; send the code as source "
            f"(spec.code.source + entrypoint) or use a runtime image with Python "
            f"{code.python_version}"
        )


def load_transform(spec: EtlSpec) -> Callable[..., Any]:
    """The user's callable, unpickled or taken from its executed source."""
    check_code(spec)
    code = spec.code
    if code.ais_class is not None:
        return load_class(code)
    if code.pickled is not None:
        try:
            fn = cloudpickle.loads(base64.b64decode(code.pickled))
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
            raise CodeLoadError(f"cannot unpickle spec.code.pickled: {why}") from e
        what = "the pickled object"
    else:
        fn = _from_source(code.source or "", code.entrypoint)
        what = f"entrypoint {code.entrypoint!r}"
    if not callable(fn):
        raise CodeLoadError(f"{what} is a {type(fn).__name__}, not a callable")
    return fn


def _from_source(source: str, entrypoint: str) -> Any:
    module = types.ModuleType(USER_MODULE)
    module.__file__ = f"<{USER_MODULE}>"
    # Registered so pickle/multiprocessing inside user code can find its classes.
    sys.modules[USER_MODULE] = module
    try:
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    except Exception as e:
        raise CodeLoadError(f"spec.code.source failed to load: {type(e).__name__}: {e}") from e
    if not hasattr(module, entrypoint):
        defined = sorted(
            k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
        )
        raise CodeLoadError(
            f"spec.code.source defines no {entrypoint!r} (set spec.code.entrypoint; "
            f"callables defined: {', '.join(defined) or 'none'})"
        )
    return getattr(module, entrypoint)


def takes_args(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` accepts a second positional parameter (``etl_args``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        return False
    positional = 0
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


PIP_TRIES = 2  # pip itself crashing (a traceback) is retried once; a refusal is not


def install_dependencies(spec: EtlSpec, deps_dir: str) -> None:
    """``pip install --target deps_dir`` the spec's requirements (no-op if none).

    A failure pip reports (no such package, a build that fails) is final. pip
    crashing instead (``ERROR: Exception:`` and a traceback) has been seen when
    the transformers of three targets install at once and share ``~/.cache/pip``;
    that is tried once more, within the same ``init_timeout``. Either way the
    error names what pip said, for a crash the exception itself (the traceback's
    last line), not only its ``ERROR: Exception:`` header.
    """
    if not spec.dependencies:
        return
    os.makedirs(deps_dir, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
        "--target",
        deps_dir,
        *spec.dependencies,
    ]
    deadline = time.monotonic() + spec.init_timeout_seconds
    for attempt in range(1, PIP_TRIES + 1):
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise DependencyError(
                f"installing dependencies {list(spec.dependencies)} took longer than "
                f"{spec.init_timeout_seconds:.0f}s"
            ) from e
        if proc.returncode == 0:
            return
        why, crashed = pip_failure(proc.stderr or proc.stdout or "")
        if not crashed or attempt == PIP_TRIES or time.monotonic() >= deadline:
            tried = f" (tried {attempt} times)" if attempt > 1 else ""
            raise DependencyError(
                f"pip could not install dependencies {list(spec.dependencies)}{tried}: {why}"
            )


def pip_failure(output: str) -> tuple[str, bool]:
    """What a failed pip said, and whether pip itself crashed (printed a traceback).

    A refusal's reason is its last ``ERROR`` line. A crash prints ``ERROR:
    Exception:``, the traceback, and the exception on the last line: both are kept.
    """
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if not lines:
        return "", False
    crashed = any(ln.startswith("Traceback (most recent call last)") for ln in lines)
    why = next((ln for ln in reversed(lines) if "ERROR" in ln), lines[-1])
    if crashed and lines[-1] != why:
        why = f"{why} {lines[-1]}"
    return why, crashed
