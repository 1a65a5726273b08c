"""How a failed ``pip install`` of ``spec.dependencies`` is reported, and when it
is tried again.

pip crashing (rather than refusing) was seen once in CI, with three transformers
installing at once: the error said only ``ERROR: Exception:``. A crash cannot be
caused on demand, so ``subprocess.run`` is replaced here by one that answers
pip's real crash transcript; ``test_startup.py`` covers a real refusal.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from etl_runtime.core.errors import DependencyError
from etl_runtime.core.spec import EtlSpec
from etl_runtime.webserver import code

# The shape pip 23-24 prints when it crashes (src/pip/_internal/cli/base_command.py).
CRASH = """ERROR: Exception:
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/pip/_internal/cli/base_command.py", line 180, in wrapper
    status = run_func(*args)
  File "/usr/lib/python3/dist-packages/pip/_internal/network/cache.py", line 64, in set
    os.replace(f.name, path)
FileNotFoundError: [Errno 2] No such file or directory: '/root/.cache/pip/http-v2/a/b/tmpx'
"""
REFUSAL = """ERROR: Could not find a version that satisfies the requirement nope==9 (from versions:)
ERROR: No matching distribution found for nope==9
"""


def _spec() -> EtlSpec:
    return EtlSpec.from_dict(
        {"code": {"source": "def transform(d):\n    return d\n"}, "dependencies": ["six==1.16.0"]}
    )


def _answers(monkeypatch: pytest.MonkeyPatch, *outputs: tuple[int, str]) -> list[list[str]]:
    calls: list[list[str]] = []
    left = list(outputs)

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        rc, err = left.pop(0)
        return subprocess.CompletedProcess(cmd, rc, "", err)

    monkeypatch.setattr(code.subprocess, "run", run)
    return calls


def test_a_pip_crash_is_tried_once_more(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _answers(monkeypatch, (2, CRASH), (0, ""))
    code.install_dependencies(_spec(), str(tmp_path))
    assert len(calls) == 2 and calls[0] == calls[1]


def _refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *outputs: tuple[int, str]
) -> tuple[int, str]:
    """How many times pip ran, and the error ``install_dependencies`` raised."""
    calls = _answers(monkeypatch, *outputs)
    with pytest.raises(DependencyError) as e:
        code.install_dependencies(_spec(), str(tmp_path))
    return len(calls), str(e.value)


def test_a_pip_crash_twice_names_the_exception(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert _refused(monkeypatch, tmp_path, (2, CRASH), (2, CRASH)) == (
        2,
        "pip could not install dependencies ['six==1.16.0'] (tried 2 times): ERROR: Exception: "
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/root/.cache/pip/http-v2/a/b/tmpx'",
    )


def test_a_refusal_is_not_retried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert _refused(monkeypatch, tmp_path, (1, REFUSAL)) == (
        1,
        "pip could not install dependencies ['six==1.16.0']: "
        "ERROR: No matching distribution found for nope==9",
    )


def test_pip_failure_reads_what_pip_said() -> None:
    assert code.pip_failure("") == ("", False)
    assert code.pip_failure("something odd\n") == ("something odd", False)
    assert code.pip_failure(REFUSAL)[1] is False
    assert code.pip_failure(CRASH)[1] is True
