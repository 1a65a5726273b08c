"""A TCP proxy on loopback in front of a backend that can break a response half-way.

Everything passes through untouched (keep-alive connections included) and
each request line is recorded (``requests``), until ``cut`` names a path:
then the answer to the next ``GET`` of that path is cut after ``after`` bytes
(head included) by closing both connections, as a backend that dies
mid-stream (or a network that drops) does. With ``down`` (the default) every
later ``GET`` of that path (a client's retry) is closed before its answer,
as by a backend that stays dead; without, they pass: a transient cut.

``flip`` names a path whose every ``GET`` answer has one byte inverted, at
``flip_at`` from the answer's first byte (head included): what a bad disk
under the backend, or a bad link without a checksum, hands a client.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading

REQUEST_LINE = re.compile(rb"(?:^|\r\n)([A-Z]+) (\S+) HTTP/1\.[01]\r\n")


class CutProxy:
    def __init__(self, upstream: str) -> None:
        host, port = upstream.split("://", 1)[-1].rstrip("/").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.cut: str | None = None  # a path (/bucket/object): its GETs are cut
        self.after = 0
        self.down = True
        self.cuts = 0  # answers cut so far
        self.flip: str | None = None  # a path (/bucket/object): a byte of its GETs inverted
        self.flip_at = 0
        self.flips = 0  # answers with a byte inverted so far
        self._cuts_at_arm = 0
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request seen
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, path: str, after: int, down: bool = True) -> None:
        """Cut the next GET of ``path`` after ``after`` bytes (and, ``down``, every later one)."""
        with self._lock:
            self._cuts_at_arm = self.cuts
        self.cut, self.after, self.down = path, after, down

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        # remaining[0]: bytes of the answer to a cut GET still let through (None: all)
        remaining: list[int | None] = [None]
        # flip[0]: bytes of the answer to a flipped GET before the byte to invert (None: none)
        flip: list[int | None] = [None]

        def close_both() -> None:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

        def requests() -> None:
            with contextlib.suppress(OSError):
                while data := client.recv(1 << 16):
                    for method, path in REQUEST_LINE.findall(data):
                        m, p = method.decode(), path.decode()
                        with self._lock:
                            self.requests.append((m, p))
                        if m == "GET" and self.cut is not None and p.split("?")[0] == self.cut:
                            with self._lock:
                                first = self.cuts == self._cuts_at_arm
                            if first or self.down:
                                remaining[0] = self.after if first else 0
                        if m == "GET" and self.flip is not None and p.split("?")[0] == self.flip:
                            flip[0] = self.flip_at
                    upstream.sendall(data)
            close_both()

        threading.Thread(target=requests, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := upstream.recv(1 << 16):
                at = flip[0]
                if at is not None and len(data) > at:
                    data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
                    flip[0] = None
                    with self._lock:
                        self.flips += 1
                elif at is not None:
                    flip[0] = at - len(data)
                left = remaining[0]
                if left is not None and len(data) >= left:
                    client.sendall(data[:left])
                    with self._lock:
                        self.cuts += 1
                    break
                if left is not None:
                    remaining[0] = left - len(data)
                client.sendall(data)
        close_both()
