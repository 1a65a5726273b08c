"""A server process's heaps: glibc's malloc told to keep what it gets, and a calmer GC.

Every Sluice server moves bytes in buffers of 64 KiB to 1 MiB: a GetBatch
share part read in one piece, the 256 KiB writes of a batch's answer, a
transformer's outputs. glibc's defaults hand such buffers back to the kernel
as soon as they are freed: at first each one is an ``mmap``/``munmap`` pair,
then (its dynamic threshold raised past them) they come from the heap's top,
which ``brk`` shrinks again whenever more than twice the threshold is free
there. Every new buffer then costs a page fault and a zeroed page per 4 KiB.
On a target assembling GetBatches of 10 KiB objects, ``strace -c`` counted
about 8 ``brk`` calls per batch, and ``perf`` put page faults and page
clearing at 2-3% of its CPU.

``tune()`` sets three of malloc's parameters (``mallopt``) at start-up:

* ``M_MMAP_THRESHOLD`` = 32 MiB (glibc's maximum): blocks up to that size come
  from the heap, not from their own ``mmap``;
* ``M_TRIM_THRESHOLD`` = 64 MiB: the heap's top is given back to the kernel
  only past that much free memory, so a process keeps at most that much of
  freed memory resident after a burst;
* ``M_TOP_PAD`` = 16 MiB: the heap grows in steps of that size (address space:
  pages become resident only when used).

Measured on the 2-core VM (``bench/batch.py``'s 64-item GetBatch of 10 KiB
objects replayed back to back at its designated target, alternating runs):
the targets' CPU per item fell from 68-86 µs to 62-65 µs with these settings
(56-67 µs with a 128 MiB trim threshold), and the designated target's from
3.0-3.7 ms to 2.6-2.8 ms per batch. Setting only the mmap threshold made it
worse (glibc then also fixes the trim threshold at its 128 KiB default); the
trim threshold and top pad alone gained about half. Under the concurrent
bench, eight batches in flight, the gain is within the noise: the heap stays
big there anyway.

``collect_less()`` is for Python's own heap. The cyclic garbage collector
runs a young collection whenever 700 more container objects are alive than
at the last one; a busy server always has that many in flight (requests,
futures, buffers' views), so each collection walked them and moved them on
to older generations, whose collections walk more. With ``gc.callbacks``
timing every collection in three targets under the same GetBatch load,
collections took 0.43 s of each target's 6.9 s of CPU (6%); with the objects
of start-up frozen (``gc.freeze``: never walked again) and a young threshold
of 10,000, 0.26 s. Garbage in cycles still goes, a little later.

A process whose environment already sets any of glibc's own malloc variables
(``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_THRESHOLD_``,
or ``glibc.malloc`` tunables in ``GLIBC_TUNABLES``) keeps them as they are:
that is the operator's choice. Elsewhere than glibc (no ``mallopt``) nothing
is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

SETTINGS = (
    (M_MMAP_THRESHOLD, 32 << 20),
    (M_TRIM_THRESHOLD, 64 << 20),
    (M_TOP_PAD, 16 << 20),
)
GLIBC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")


def operator_set(env: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """The environment already tells glibc's malloc what to do."""
    return any(k in env for k in GLIBC_ENV) or "glibc.malloc." in env.get("GLIBC_TUNABLES", "")


def tune() -> bool:
    """Apply ``SETTINGS`` (once per process, before serving); True if they took."""
    if not sys.platform.startswith("linux") or operator_set():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in SETTINGS)


YOUNG_THRESHOLD = 10_000  # the interpreter's default is 700


def collect_less() -> None:
    """Freeze what start-up made and collect the young generation less often (once per
    process, after the app is built, before serving)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
