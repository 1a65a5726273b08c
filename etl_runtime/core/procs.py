"""``python -m etl_runtime.core.procs [--adoptable] PARENT CMD...``: exec CMD, tied to its parent.

Local transformers and servers are started through this launcher so that they
get ``PR_SET_PDEATHSIG=SIGTERM`` (Linux) before ``exec``: if their parent (the
gateway, or ``sluice up``) dies in any way -- even SIGKILL, or a shutdown path
that skips its clean-up -- they are told to stop instead of living on as
orphans. Using a launcher instead of ``preexec_fn`` keeps ``fork`` safe in a
multi-threaded parent. Elsewhere it simply ``exec``s the command.

``--adoptable`` (transformers under ``sluice up``): the parent's death sends
``ADOPTABLE_SIGNAL`` instead, and the child, having called
``outlive_parent_if_adopted()``, lives on when ``sluice up`` (a child subreaper,
``SLUICE_SUPERVISOR_PID``) adopted it: a gateway killed with ``-9`` comes back
and adopts its transformers, and ETLs are not interrupted. When ``sluice up``
itself dies the signal comes again, and then the child stops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
ADOPTABLE_SIGNAL = signal.SIGUSR2
SUPERVISOR_ENV = "SLUICE_SUPERVISOR_PID"


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before the prctl took effect
        sys.exit(f"sluice: parent process {parent} is gone; not starting {sys.argv[2:]}")


PR_SET_NAME = 15


def set_process_name(name: str) -> None:
    """The name ``ps -o comm``, ``top`` and psutil's ``name()`` show (Linux; 15 bytes).

    Forked helpers and workers keep their parent's command line; this tells them apart.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)  # no find_library: safe after fork
            libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
        except (OSError, AttributeError):
            pass


def command(
    parent: int, argv: list[str], adoptable: bool = False, python: str | None = None
) -> list[str]:
    """The argv that runs ``argv`` through this launcher (run by ``python``, default ours)."""
    flag = ["--adoptable"] if adoptable else []
    launcher = [python or sys.executable, "-m", "etl_runtime.core.procs"]
    return [*launcher, *flag, str(parent), *argv]


def outlive_parent_if_adopted() -> None:
    """In a child started ``--adoptable``: when the parent dies, live on if the
    supervisor (``SLUICE_SUPERVISOR_PID``) adopted us, else stop (SIGTERM to self)."""
    supervisor = os.environ.get(SUPERVISOR_ENV, "")
    parent = os.getppid()

    def on_parent_death(signum: int, frame: object) -> None:
        ppid = os.getppid()
        if ppid == parent:
            # The thread that forked us exited while the rest of its process lives
            # on for a moment (a SIGKILLed gateway's threads die one by one): the
            # kernel hands us to a sibling thread first. The last one's exit brings
            # the signal again, then from our new parent.
            return
        if supervisor.isdigit() and ppid == int(supervisor):
            os.write(2, f"sluice: parent died; adopted by sluice up (pid {supervisor})\n".encode())
            return
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(ADOPTABLE_SIGNAL, on_parent_death)


def main(argv: list[str]) -> None:
    adoptable = argv[:1] == ["--adoptable"]
    argv = argv[1:] if adoptable else argv
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit(
            "usage: python -m etl_runtime.core.procs [--adoptable] PARENT_PID COMMAND [ARGS...]"
        )
    die_with_parent(int(argv[0]), ADOPTABLE_SIGNAL if adoptable else signal.SIGTERM)
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
