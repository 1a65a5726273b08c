"""A real small filesystem for tests that need a full disk: a tmpfs mounted for the test.

Mounting needs root (CAP_SYS_ADMIN), as the test machines and CI run; anywhere
else the test is skipped, saying so. Nothing here fakes ``ENOSPC``: the kernel
answers it when the tmpfs is full.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str = "2m", nr_inodes: int | None = None) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (and at most ``nr_inodes`` inodes) at ``path``; unmount after."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (f",nr_inodes={nr_inodes}" if nr_inodes else "")
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("no `mount` command here: cannot make a small filesystem to fill")
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here (needs root): {r.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)  # busy: detach it anyway
