"""``python -m etl_runtime.core.procs PARENT_PID CMD...``: exec CMD, tied to its parent.

Local transformers and servers are started through this launcher so that they
get ``PR_SET_PDEATHSIG=SIGTERM`` (Linux) before ``exec``: if their parent (the
gateway, or ``sluice up``) dies in any way -- even SIGKILL, or a shutdown path
that skips its clean-up -- they are told to stop instead of living on as
orphans. Using a launcher instead of ``preexec_fn`` keeps ``fork`` safe in a
multi-threaded parent. Elsewhere it simply ``exec``s the command.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before the prctl took effect
        sys.exit(f"sluice: parent process {parent} is gone; not starting {sys.argv[2:]}")


def command(parent: int, argv: list[str]) -> list[str]:
    """The argv that runs ``argv`` through this launcher."""
    return [sys.executable, "-m", "etl_runtime.core.procs", str(parent), *argv]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit("usage: python -m etl_runtime.core.procs PARENT_PID COMMAND [ARGS...]")
    die_with_parent(int(argv[0]))
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
