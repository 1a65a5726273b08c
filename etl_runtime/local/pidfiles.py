"""Pid files of the local cluster's transformers (``<state>/run/<name>.<pid>.json``).

Written when a transformer starts and removed when it is stopped, so a
controller that restarts (or ``sluice up`` after a crash) can adopt, or clean
up, transformers an earlier one left running.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl_runtime.local.processes import TransformerProcess


def pid_dir(state_dir: Path) -> Path:
    return state_dir / "run"


def write_pid_file(state_dir: Path, proc: TransformerProcess) -> None:
    d = pid_dir(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{proc.name}.{proc.pid}.tmp"
    tmp.write_text(json.dumps(proc.pid_record()))
    os.replace(tmp, d / f"{proc.name}.{proc.pid}.json")


def remove_pid_file(state_dir: Path, proc: TransformerProcess) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pid_dir(state_dir) / f"{proc.name}.{proc.pid}.json")


def read_pid_files(state_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(pid_dir(state_dir).glob("*.json")):
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                path.unlink()
    return out
