"""``Forker``: a single-threaded helper that forks the transformer's worker processes.

User code runs only in worker processes (``pool``). Forking them straight from
the server process is unsafe (its threads and event loop), and starting each
one afresh costs an interpreter and every import again: seconds with
torch. So the server forks this helper once, early, before any
thread or event loop exists (``Forker.start``). The helper imports the mode's
heavy modules (``preload``) once, then forks one worker per request in a few
milliseconds; a worker starts with everything the helper imported and loads
only the user's code. Forked from a transformer that was itself forked from the
local cluster's pre-started runtime (``zygote``), the helper has nothing left
to import at all.

What ``multiprocessing``'s ``forkserver`` (used before) gave, it keeps: a
worker never shares a thread or a lock with the server; it is in the
transformer's process group (a ``killpg`` sweeps it); it exits when the
server's end of its socket closes (``worker``); the helper exits when the
server's end of the control socket closes, so nothing outlives a transformer
killed with ``-9``. A helper that dies (the OOM killer) is replaced at the next
worker start, by fork and exec this time (``Forker._respawn``), and its orphaned
workers can still be killed (a timed-out task's worker must be).

The control socket carries length-prefixed pickles. Server to helper:
``(id, target, args)`` with the worker's socket as an ``SCM_RIGHTS`` fd; the
helper answers ``("forked", id, pid)``, and ``("exit", pid, exitcode)`` when
it reaps a worker (negative: killed by that signal, as ``multiprocessing``
reports it). ``ForkedProcess`` is the server's handle on one worker, with the
``multiprocessing.Process`` methods the pool uses.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from etl_runtime.core.procs import set_process_name

_LEN = struct.Struct("!I")
log = logging.getLogger("sluice.transformer")
# The body of a helper started afresh (``Forker._respawn``): argv = control fd, preload.
_HELPER_CODE = (
    "import socket, sys\n"
    "from etl_runtime.webserver.forker import _helper_main\n"
    "_helper_main(socket.socket(fileno=int(sys.argv[1])), sys.argv[2:])\n"
)


def _send(sock: socket.socket, msg: Any, fds: Sequence[int] = ()) -> None:
    data = pickle.dumps(msg)
    frame = _LEN.pack(len(data)) + data
    if fds:
        # The fds travel with the first bytes; sendall the rest.
        sent = socket.send_fds(sock, [frame], list(fds))
        sock.sendall(frame[sent:])
    else:
        sock.sendall(frame)


def _recv_exact(sock: socket.socket, n: int, head: bytes = b"") -> bytes:
    buf = bytearray(head)
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, max_fds: int = 0) -> tuple[Any, list[int]]:
    fds: list[int] = []
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, _LEN.size, max_fds)
        if not head:
            raise EOFError
    else:
        head = b""
    head = _recv_exact(sock, _LEN.size, head)
    (size,) = _LEN.unpack(head)
    return pickle.loads(_recv_exact(sock, size)), fds


class ForkedProcess:
    """One worker forked by the helper: the ``multiprocessing.Process`` calls the pool makes."""

    def __init__(self, forker: Forker, target: Callable[..., Any], args: tuple[Any, ...]):
        self._forker = forker
        self._target = target
        self._args = args
        self.pid: int = 0
        self.exitcode: int | None = None
        self._exited = threading.Event()
        self._orphaned = False

    def start(self) -> None:
        """Fork it (blocking: call from a thread); the first argument must be a socket."""
        sock, *rest = self._args
        self.pid = self._forker.fork(self, self._target, sock, tuple(rest))

    def _reaped(self, code: int, orphaned: bool = False) -> None:
        """Its exit, as the helper reported it; ``orphaned``: the helper died, so no
        exit will be reported and the process may still run (``kill`` still kills)."""
        self.exitcode = code
        self._orphaned = orphaned
        self._exited.set()

    def is_alive(self) -> bool:
        return self.pid != 0 and not self._exited.is_set()

    def kill(self) -> None:
        if self.is_alive() or self._orphaned:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        self._exited.wait(timeout)


class Forker:
    """The server's end of the helper; see the module docstring."""

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self.preload = tuple(preload)
        self.pid = 0
        self._control: socket.socket | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._waiting: dict[int, tuple[threading.Event, list[int]]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}  # reaped before fork() saw its pid
        self._reader: threading.Thread | None = None
        self._gone = False
        self._popen: subprocess.Popen[bytes] | None = None
        self.respawns = 0  # helpers started again after one died

    def start(self) -> None:
        """Fork the helper. Call while this process has a single thread."""
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the helper
            try:
                ours.close()
                _helper_main(theirs, self.preload)
            finally:
                os._exit(0)
        theirs.close()
        self.pid, self._control = pid, ours

    def process(self, target: Callable[..., Any], args: tuple[Any, ...]) -> ForkedProcess:
        """A worker to be: ``target(*args)`` once its ``start()`` is called."""
        return ForkedProcess(self, target, args)

    def _respawn(self) -> None:
        """A new helper after the first one died (call under the lock). This process
        has threads and an event loop now, so the helper is started afresh (fork and
        exec, which is safe) instead of forked: it imports its preload again, seconds
        with torch, once. Without it every later worker spawn would fail until the
        transformer itself is restarted."""
        old_pid = self.pid
        if self._control is not None:
            self._control.close()
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(old_pid, os.WNOHANG)  # the dead helper: no zombie
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        child = subprocess.Popen(
            [sys.executable, "-c", _HELPER_CODE, str(theirs.fileno()), *self.preload],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self._popen = child  # keeps the handle: its exit is reaped by close()
        self.pid, self._control = child.pid, ours
        self._gone, self._reader = False, None
        self.respawns += 1
        log.warning(
            "the worker forker (pid %s) exited; started a new one (pid %s)", old_pid, child.pid
        )

    def fork(
        self, proc: ForkedProcess, target: Callable[..., Any], sock: socket.socket, args: tuple
    ) -> int:
        if self._control is None:
            raise OSError("the worker forker is not running")
        with self._lock:
            if self._gone:  # checked under the lock: the reader's wake-up cannot be missed
                self._respawn()
            if self._reader is None:
                self._reader = threading.Thread(
                    target=self._read, name="sluice-forker", daemon=True
                )
                self._reader.start()
            self._next_id += 1
            rid = self._next_id
            done: tuple[threading.Event, list[int]] = (threading.Event(), [])
            self._waiting[rid] = done
            _send(self._control, (rid, target, args), [sock.fileno()])
        # No timeout: the helper may still be importing (torch on a busy machine); if
        # it dies, the reader sees the end of the socket and wakes us.
        done[0].wait()
        if not done[1]:
            raise OSError("the worker forker exited")
        pid = done[1][0]
        with self._lock:
            self._children[pid] = proc
            early = self._early_exits.pop(pid, None)
            orphaned = early is None and self._gone  # no one will report its exit now
            if orphaned:
                del self._children[pid]
                early = -signal.SIGKILL
        if early is not None:
            proc._reaped(early, orphaned)
        return pid

    def _read(self) -> None:
        control = self._control
        assert control is not None
        try:
            while True:
                msg, _ = _recv(control)
                if msg[0] == "forked":
                    _, rid, pid = msg
                    with self._lock:
                        event, out = self._waiting.pop(rid)
                    out.append(pid)
                    event.set()
                elif msg[0] == "exit":
                    _, pid, code = msg
                    with self._lock:
                        proc = self._children.pop(pid, None)
                        if proc is None:
                            self._early_exits[pid] = code
                    if proc is not None:
                        proc._reaped(code)
        except (EOFError, OSError):
            pass
        with self._lock:
            self._gone = True
            waiting, self._waiting = list(self._waiting.values()), {}
            children, self._children = list(self._children.values()), {}
        for event, _out in waiting:
            event.set()
        for proc in children:  # no one reaps them now; unknown exit code
            proc._reaped(-signal.SIGKILL, orphaned=True)

    def close(self) -> None:
        """Close the control socket: the helper exits (its workers exit on their own)."""
        if self._control is not None:
            with contextlib.suppress(OSError):
                self._control.shutdown(socket.SHUT_RDWR)
            self._control.close()
        if self._popen is not None:
            self._popen.wait()
        elif self.pid:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(self.pid, 0)
        self.pid = 0


def close_sockets(keep: int) -> None:
    """Close every socket this (just forked) process inherited but ``keep``: a
    server's listening socket must not live on in its helper and workers."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return  # not Linux: the inherited sockets stay open, harmless while the server runs
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        if fd in (keep, null) or fd <= 2:
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                # dup2, not close: a Python object may still own the number and
                # close it one day; it then closes /dev/null, not a reused fd.
                os.dup2(null, fd)
    os.close(null)


def _helper_main(control: socket.socket, preload: Sequence[str]) -> None:
    # The server decides when workers stop; a Ctrl-C to the group must not kill us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    close_sockets(keep=control.fileno())
    set_process_name("sluice-forker")
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # the worker that needs it reports the failure by name
            pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    poller = select.poll()
    poller.register(control.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for fd, _ev in events:
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                _reap(control)
                continue
            try:
                (rid, target, args), fds = _recv(control, max_fds=1)
            except (EOFError, OSError):
                return  # the server is gone: so are we (workers follow on hang-up)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for end in (wake_r, wake_w):
                    os.close(end)
                control.close()
                code = 0
                set_process_name("sluice-worker")
                try:
                    target(socket.socket(fileno=fds[0]), *args)
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    with contextlib.suppress(Exception):
                        sys.stdout.flush()
                        sys.stderr.flush()
                os._exit(code)
            for f in fds:
                os.close(f)
            _send(control, ("forked", rid, pid))
        _reap(control)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            _send(control, ("exit", pid, os.waitstatus_to_exitcode(status)))
