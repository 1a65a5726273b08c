"""The worker process: loads the user's code once, then serves tasks forever.

``worker_main`` is the process target. It applies ``spec.env``, puts the
dependencies directory on ``sys.path``, loads the code and answers READY (or
LOAD_ERROR), then handles one task at a time from its socket (see ``ipc``):
an object (result streamed back chunk by chunk as the user's iterable produces
it) or one WebDataset sample. Whatever the user code prints is sent to the
server as LOG frames, so it shows in ``GET /logs``. The worker exits when the
server closes the socket.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from etl_runtime.core.errors import (
    SluiceError,
    StartupError,
    TransformError,
    traceback_tail,
)
from etl_runtime.core.spec import EtlSpec
from etl_runtime.webserver import calls, ipc
from etl_runtime.webserver.code import load_transform, takes_args


def _log_sender(frames: ipc.FrameSocket) -> Callable[[str], None]:
    """What user code prints goes to the server as LOG frames (``GET /logs``)."""

    def send(text: str) -> None:
        try:
            frames.send(ipc.LOG, text.encode("utf-8", "replace"))
        except OSError:  # the server is gone; nobody is listening any more
            pass

    return send


_HANGUP = select.POLLHUP | getattr(select, "POLLRDHUP", 0)


def _exit_when_server_hangs_up(sock: socket.socket) -> None:
    """Exit as soon as the server's end of our socket is closed.

    The main thread may be deep in user code (a slow import, a stuck
    transform) and never read the socket again; if the transformer was killed
    outright we must not live on as an orphan. (Dying with our parent does not
    help: the parent is the pool's forker helper, which lives as long as the
    server's end of its control socket is open.) Polling for hang-up only never consumes data.
    """
    poller = select.poll()
    poller.register(sock.fileno(), _HANGUP)
    while True:
        for _fd, events in poller.poll():
            if events & _HANGUP:
                os._exit(0)


def worker_main(sock: socket.socket, spec_json: str, deps_dir: str | None) -> None:
    # The server decides when we stop (by closing the socket): a Ctrl-C or a
    # SIGTERM sent to the whole process group must not kill workers under it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(
        target=_exit_when_server_hangs_up, args=(sock,), name="hangup-watch", daemon=True
    ).start()
    frames = ipc.FrameSocket(sock)
    calls.reseed_numpy()
    spec = EtlSpec.from_dict(__import__("json").loads(spec_json))
    os.environ.update(dict(spec.env))
    if deps_dir:
        sys.path.insert(0, deps_dir)
    sys.stdout = sys.stderr = calls.LineWriter(_log_sender(frames))
    try:
        fn = load_transform(spec)
        sample_transform = None
        if spec.mode == "wds":
            # Imported here: webdataset pulls in torch, which object mode never needs.
            from etl_runtime.webserver.samples import SampleTransform

            sample_transform = SampleTransform(fn, takes_args(fn), spec.decode)
    except StartupError as e:
        frames.send(ipc.LOAD_ERROR, pickle.dumps(str(e)))
        return
    except BaseException as e:  # anything the user's module does on import
        frames.send(ipc.LOAD_ERROR, pickle.dumps(f"code failed to load: {type(e).__name__}: {e}"))
        return
    frames.send(ipc.READY, pickle.dumps(os.getpid()))
    with_args = takes_args(fn)
    try:
        while True:
            kind, payload = frames.recv()
            if kind == ipc.OBJECT:
                _object_task(frames, fn, with_args, payload)
            elif kind == ipc.SAMPLE and sample_transform is not None:
                _sample_task(frames, sample_transform, payload)
            else:
                raise RuntimeError(f"unexpected frame kind {kind}")
            sys.stdout.flush()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


def _send_error(frames: ipc.FrameSocket, err: SluiceError) -> None:
    frames.send(ipc.ERROR, pickle.dumps(err.to_wire()))


def _object_task(
    frames: ipc.FrameSocket, fn: Callable[..., Any], with_args: bool, payload: bytes
) -> None:
    args, fqn, obj = pickle.loads(payload)
    data = None
    if fqn is None:
        parts = []
        while True:
            kind, chunk = frames.recv()
            if kind == ipc.DATA_END:
                break
            parts.append(chunk)
        data = b"".join(parts)
        del parts
    try:
        result = calls.object_result(fn, with_args, data, fqn, obj, args)
        del data
        if isinstance(result, calls.Chunk):
            view = memoryview(result).cast("B")
            # The length is known: the server can answer with Content-Length.
            # SIZE, the chunks and END go out in as few sends as there are chunks.
            _send_chunked(frames, view, (ipc.SIZE, ipc.LENGTH.pack(len(view))), end=True)
            return
        for item in result:
            _send_chunked(frames, calls.chunk_of(item))
    except SluiceError as e:
        return _send_error(frames, e)
    except Exception as e:  # raised while iterating the result
        return _send_error(frames, calls.raised(e))
    frames.send(ipc.END)


def _send_chunked(
    frames: ipc.FrameSocket,
    data: ipc.Payload,
    before: tuple[int, ipc.Payload] | None = None,
    end: bool = False,
) -> None:
    """``data`` as CHUNK frames; ``before`` goes with the first send, END with the last."""
    view = memoryview(data).cast("B")
    batch = [before] if before else []
    for start in range(0, len(view), ipc.MAX_CHUNK):
        batch.append((ipc.CHUNK, view[start : start + ipc.MAX_CHUNK]))
        if start + ipc.MAX_CHUNK >= len(view) and end:
            batch.append((ipc.END, b""))
        frames.send_frames(*batch)
        batch = []
    if batch or (end and not view):
        frames.send_frames(*batch, *([(ipc.END, b"")] if end else []))


def _sample_task(frames: ipc.FrameSocket, transform: Any, payload: bytes) -> None:
    sample, args = pickle.loads(payload)
    try:
        out = transform(sample, args)
    except SluiceError as e:
        return _send_error(frames, e)
    except Exception as e:  # a bug outside the user's function; still name the sample
        key = str(sample.get("__key__"))
        return _send_error(
            frames,
            TransformError(
                f"sample {key!r}: {type(e).__name__}: {e}", sample=key, detail=traceback_tail(e)
            ),
        )
    frames.send(ipc.RESULT, out)
