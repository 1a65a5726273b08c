"""An HTTP/1.1 proxy on loopback in front of a backend that breaks chosen uploads.

Where ``cutproxy.CutProxy`` cuts answers to GETs at the TCP level, this one
reads each request (head, then a ``Content-Length`` body) so it can break a
request's *body*: a ``Fault`` matches a method and a path (and optionally a
header) and either cuts the request after ``reset`` bytes of the body went
upstream (a link that drops mid-chunk: the backend gets those bytes and an end,
the client a reset; with ``stall``, one where nothing
moves for that long first), answers a status of its
own without passing the request on (``status``: a flaky front end's 503, or a
403), or passes the request on with its path rewritten (``rewrite``: a
``upload_id`` the backend never issued, so its own 404 comes back). Each fault
fires ``times`` times (``None``: for ever). Each request goes upstream on its
own connection with ``Connection: close`` (and the answer tells the client
so), so one answer ends where the backend closes.

``seen`` records each request: method, path, headers and the body bytes that
went upstream, which is what says how much of a body was sent again.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Fault:
    method: str
    path: str  # a regular expression, searched in the request target
    reset: int | None = None  # reset after this many body bytes went upstream
    stall: float = 0.0  # with reset: first hold the connection this long, sending nothing
    status: int | None = None  # answer this, pass nothing on
    rewrite: tuple[str, str] | None = None  # (pattern, replacement) on the target
    header: tuple[str, str] | None = None  # (name, regex) the request must also match
    times: int | None = 1  # None: every match
    fired: int = 0
    stalled: int = 0  # stalls that ran their full length

    def matches(self, method: str, target: str, headers: dict[str, str]) -> bool:
        if self.times is not None and self.fired >= self.times:
            return False
        if method != self.method or not re.search(self.path, target):
            return False
        if self.header is not None:
            value = headers.get(self.header[0].lower(), "")
            return re.search(self.header[1], value) is not None
        return True


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    sent: int = 0  # body bytes that went upstream
    fault: str = ""  # what the proxy did to it ("" : nothing)
    status: int | None = field(default=None)


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        host, port = upstream.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.faults: list[Fault] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

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
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = client.recv(1 << 16)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                assert "chunked" not in headers.get("transfer-encoding", ""), lines[0]
                length = int(headers.get("content-length", "0"))
                seen = Seen(method, target, headers)
                with self._lock:
                    self.seen.append(seen)
                    fault = next(
                        (f for f in self.faults if f.matches(method, target, headers)), None
                    )
                    if fault is not None:
                        fault.fired += 1
                if fault is not None and fault.status is not None:
                    seen.fault, seen.status = f"status {fault.status}", fault.status
                    while len(buf) < length:  # read the body, pass none of it on
                        data = client.recv(1 << 16)
                        if not data:
                            return
                        buf += data
                    buf = buf[length:]
                    client.sendall(
                        f"HTTP/1.1 {fault.status} Injected\r\nContent-Type: text/plain\r\n"
                        f"Content-Length: 8\r\nConnection: close\r\n\r\ninjected".encode()
                    )
                    return
                if fault is not None and fault.rewrite is not None:
                    target = re.sub(fault.rewrite[0], fault.rewrite[1], target)
                    seen.fault = f"rewritten to {target}"
                self._forward(client, method, target, lines[1:], buf, length, seen, fault)
                return  # one request per connection: the backend's answer closed it
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            client.close()

    def _forward(
        self,
        client: socket.socket,
        method: str,
        target: str,
        header_lines: list[str],
        buf: bytes,
        length: int,
        seen: Seen,
        fault: Fault | None,
    ) -> None:
        upstream = socket.create_connection(self.upstream)
        try:
            kept = [h for h in header_lines if not h.lower().startswith("connection:")]
            head = "\r\n".join([f"{method} {target} HTTP/1.1", *kept, "Connection: close"])
            upstream.sendall(head.encode("latin-1") + b"\r\n\r\n")
            while len(buf) < length:  # the whole body first: the backend may answer early
                data = client.recv(1 << 16)
                if not data:
                    return
                buf += data
            cut = fault.reset if fault is not None and fault.reset is not None else None
            if cut is not None and cut < length:
                with contextlib.suppress(OSError):
                    upstream.sendall(buf[:cut])
                seen.sent = cut
                seen.fault = f"reset after {cut} body bytes"
                if fault is not None and fault.stall:
                    time.sleep(fault.stall)  # a link where nothing moves: the client times out
                    fault.stalled += 1
                # The backend keeps what reached it: a FIN upstream (an RST would drop
                # what its socket holds unread, as much as the backend's scheduling
                # allows), and the proxy waits for it to be read; the client gets the RST
                # of a link that dropped.
                with contextlib.suppress(OSError):
                    upstream.shutdown(socket.SHUT_WR)
                    upstream.settimeout(10)
                    while upstream.recv(1 << 16):
                        pass
                linger = struct.pack("ii", 1, 0)
                with contextlib.suppress(OSError):
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                return
            try:
                upstream.sendall(buf[:length])
                seen.sent = length
            except OSError:  # it answered (and closed) before the whole body: relay that
                pass
            first = True
            while data := upstream.recv(1 << 16):
                if first:
                    with contextlib.suppress(ValueError, IndexError):
                        seen.status = int(data.split(b" ", 2)[1])
                    line, _, rest = data.partition(b"\r\n")
                    if b"\r\nconnection:" not in data.split(b"\r\n\r\n")[0].lower():
                        # tell the client too, or it reuses a connection that is closing
                        data = line + b"\r\nConnection: close\r\n" + rest
                    first = False
                client.sendall(data)
        finally:
            upstream.close()
