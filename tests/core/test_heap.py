"""``core/heap.py``: a server process's malloc keeps big blocks on its heap, unless the
operator set glibc's own malloc variables.

Each case runs in a fresh interpreter: glibc's parameters are per process and are
set once. Where a 2 MiB block comes from tells them apart: with glibc's defaults
its own ``mmap`` (far above the heap's break), once tuned the heap (below it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from etl_runtime.core import heap

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import ctypes, ctypes.util, json, sys
from etl_runtime.core import heap
tuned = heap.tune() if sys.argv[1] == "tune" else None
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = libc.sbrk.restype = ctypes.c_void_p
libc.malloc.argtypes, libc.sbrk.argtypes = (ctypes.c_size_t,), (ctypes.c_ssize_t,)
block = libc.malloc(2 << 20)
print(json.dumps({"tuned": tuned, "on_heap": block < libc.sbrk(0)}))
"""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux servers"
)


def probe(mode: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k not in heap.GLIBC_ENV}
    clean.pop("GLIBC_TUNABLES", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


def test_a_tuned_process_takes_big_blocks_from_its_heap() -> None:
    assert probe("plain") == {"tuned": None, "on_heap": False}  # glibc: its own mmap
    assert probe("tune") == {"tuned": True, "on_heap": True}


@pytest.mark.parametrize(
    "env",
    [
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"},
    ],
)
def test_the_operators_malloc_settings_are_kept(env: dict[str, str]) -> None:
    assert probe("tune", **env) == {"tuned": False, "on_heap": False}


def test_other_tunables_are_not_the_operators_malloc_settings() -> None:
    assert not heap.operator_set({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"})
    assert heap.operator_set({"GLIBC_TUNABLES": "glibc.pthread.rseq=0:glibc.malloc.top_pad=1"})
