"""A load generator that is not the bottleneck: processes x threads x raw HTTP/1.1.

``run_load(requests, concurrency, seconds)`` keeps ``concurrency`` requests in
flight for ``seconds`` (after a warm-up), spread over up to ``procs`` client
processes (forked), each with one thread per connection. A connection sends a
request with plain ``sendall`` and reads the answer into a preallocated buffer
(``recv_into``; ``Content-Length`` or chunked), so a client spends little CPU
per object; the threads drop the GIL in every socket call. A ``307`` is
followed (as the SDK follows the gateway's redirect), keeping one connection
per host. Each process reports its own CPU time over the measured window, so
the caller can print client CPU per request next to the servers'.

A wrong status or a length other than expected counts as an error, never as
throughput.

Latencies are those of every request that ends after the measured window
opens, including one that began in the warm-up. Counting only the requests
that began in the window hid a connection that a server left waiting: AIStore's
uvicorn (``--workers 2``) at 64 in flight left a third of them unserved for the
whole window (5.6 s), and its p99 read 410 ms instead of 5,567.
"""

from __future__ import annotations

import multiprocessing
import resource
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

BUF = 4 << 20


@dataclass(frozen=True)
class Req:
    method: str
    url: str  # absolute: http://host:port/path?query
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    expect_len: int | None = None  # answer length that counts as success


@dataclass
class Result:
    requests: int = 0
    errors: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    client_cpu: float = 0.0  # CPU seconds of all client processes, measured window
    latencies: list[float] = field(default_factory=list)
    first_error: str = ""

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    @property
    def p50_ms(self) -> float:
        return self.pct(0.50) * 1e3

    @property
    def p99_ms(self) -> float:
        return self.pct(0.99) * 1e3

    @property
    def client_cpu_ms(self) -> float:
        return self.client_cpu * 1e3 / max(1, self.requests)


class _Conn:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(BUF)
        self.view = memoryview(self.buf)
        self.start = self.end = 0

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buf):
            self.buf[: self.end - self.start] = self.buf[self.start : self.end]
            self.end -= self.start
            self.start = 0
        n = self.sock.recv_into(self.view[self.end :])
        if n == 0:
            raise ConnectionError("server closed the connection")
        self.end += n

    def line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n", self.start, self.end)
            if i >= 0:
                out = bytes(self.buf[self.start : i])
                self.start = i + 2
                return out
            self._fill()

    def skip(self, n: int) -> None:
        while n > 0:
            if self.start == self.end:
                self.start = self.end = 0
                got = self.sock.recv_into(self.view, min(n, len(self.buf)))
                if got == 0:
                    raise ConnectionError("server closed the connection mid-body")
                n -= got
                continue
            take = min(n, self.end - self.start)
            self.start += take
            n -= take

    def request(self, head: bytes, body: bytes) -> tuple[int, int, str | None, bool]:
        """Send; read the whole answer. (status, body length, location, keep-alive)."""
        if body and len(body) < 65536:
            self.sock.sendall(head + body)
        else:
            self.sock.sendall(head)
            if body:
                self.sock.sendall(body)
        status = int(self.line().split(b" ", 2)[1])
        length, chunked, location, keep = None, False, None, True
        while line := self.line():
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"location":
                location = value.strip().decode()
            elif name == b"connection" and b"close" in value.lower():
                keep = False
        total = 0
        if chunked:
            while True:
                size = int(self.line().split(b";")[0], 16)
                if size == 0:
                    while self.line():
                        pass
                    break
                self.skip(size)
                total += size
                self.line()
        elif length is not None:
            self.skip(length)
            total = length
        else:
            keep = False
        return status, total, location, keep


def _head(req: Req, path: str, host: str) -> bytes:
    lines = [f"{req.method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in req.headers]
    if req.body or req.method in ("PUT", "POST"):
        lines.append(f"Content-Length: {len(req.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _split(url: str) -> tuple[str, int, str]:
    u = urlsplit(url)
    path = u.path + (f"?{u.query}" if u.query else "")
    return u.hostname or "127.0.0.1", u.port or 80, path


def _fetch(
    conns: dict[tuple[str, int], _Conn], req: Req, host: str, port: int, head: bytes
) -> tuple[bool, int, str]:
    """One request (following 307s) on the thread's connections: (ok, bytes, error)."""
    status, got = 0, 0
    try:
        for _hop in range(3):
            conn = conns.get((host, port))
            if conn is None:
                conn = conns[(host, port)] = _Conn(host, port)
            try:
                status, got, location, keep = conn.request(head, req.body)
            except (ConnectionError, TimeoutError, OSError):
                conn.close()
                del conns[(host, port)]
                raise
            if not keep:
                conn.close()
                del conns[(host, port)]
            if status == 307 and location:
                host, port, path = _split(location)
                head = _head(req, path, f"{host}:{port}")
                continue
            break
        ok = status == 200 and (req.expect_len is None or got == req.expect_len) and got > 0
    except OSError as e:
        return False, 0, f"{type(e).__name__}: {e}"
    return ok, got, "" if ok else f"status {status}, {got} bytes"


def _thread(
    reqs: list[Req], offset: int, stride: int, t0: float, t1: float, out: dict[str, object]
) -> None:
    conns: dict[tuple[str, int], _Conn] = {}
    heads = []
    for r in reqs:
        host, port, path = _split(r.url)
        heads.append((host, port, _head(r, path, f"{host}:{port}")))
    lat: list[float] = []
    count = errors = nbytes = 0
    first_error = ""
    i = offset
    while True:
        now = time.perf_counter()
        if now >= t1:
            break
        req = reqs[i % len(reqs)]
        host, port, head = heads[i % len(reqs)]
        i += stride
        begin = now
        ok, got, error = _fetch(conns, req, host, port, head)
        first_error = first_error or error
        end = time.perf_counter()
        if begin >= t0:
            if ok:
                count += 1
                nbytes += got
                lat.append(end - begin)
            else:
                errors += 1
        elif ok and end > t0:  # began in the warm-up: its wait is still a latency
            lat.append(end - begin)
    for c in conns.values():
        c.close()
    out.update(count=count, errors=errors, nbytes=nbytes, lat=lat, first_error=first_error)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def tree_cpu(pid: int) -> float:
    """CPU seconds so far (user + system) of server process ``pid`` and all its
    descendants (a transformer's servers and workers, a cluster's processes)."""
    import psutil  # dev dependency: only the benches that watch servers need it

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    return cpu_of(procs)


def cpu_of(procs: list[Any]) -> float:
    """CPU seconds so far (user + system) of these ``psutil.Process``es; one that
    is gone (or may not be read) counts nothing."""
    import psutil

    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _process(
    reqs: list[Req], first: int, stride: int, threads: int, t0: float, t1: float, queue: object
) -> None:
    outs: list[dict[str, object]] = [{} for _ in range(threads)]
    ts = [
        threading.Thread(target=_thread, args=(reqs, first + k, stride, t0, t1, outs[k]))
        for k in range(threads)
    ]
    for t in ts:
        t.start()
    time.sleep(max(0.0, t0 - time.perf_counter()))
    cpu0 = _cpu()
    time.sleep(max(0.0, t1 - time.perf_counter()))
    for t in ts:
        t.join()
    cpu = _cpu() - cpu0
    queue.put((outs, cpu))  # type: ignore[attr-defined]


def run_load(
    reqs: list[Req], concurrency: int, seconds: float, procs: int = 4, warmup: float = 1.0
) -> Result:
    """``concurrency`` requests in flight for ``seconds`` after ``warmup``; see module doc."""
    procs = max(1, min(procs, concurrency))
    per = [concurrency // procs + (1 if p < concurrency % procs else 0) for p in range(procs)]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    t0 = time.perf_counter() + 0.3 + warmup  # perf_counter is system-wide on Linux
    t1 = t0 + seconds
    workers = []
    first = 0
    for n in per:
        p = ctx.Process(target=_process, args=(reqs, first, concurrency, n, t0, t1, queue))
        p.start()
        workers.append(p)
        first += n
    result = Result(seconds=seconds)
    for _ in workers:
        outs, cpu = queue.get(timeout=seconds + warmup + 300)
        result.client_cpu += cpu
        for o in outs:
            result.requests += o["count"]
            result.errors += o["errors"]
            result.nbytes += o["nbytes"]
            result.latencies.extend(o["lat"])
            result.first_error = result.first_error or o["first_error"]
    for p in workers:
        p.join()
    return result


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _once_thread(reqs: list[Req], t0: float, out: dict[str, object]) -> None:
    conns: dict[tuple[str, int], _Conn] = {}
    heads = []
    for r in reqs:
        host, port, path = _split(r.url)
        heads.append((host, port, _head(r, path, f"{host}:{port}")))
    if heads:  # connected before the clock starts, as a pooled client would be
        conns[heads[0][:2]] = _Conn(*heads[0][:2])
    lat: list[float] = []
    count = errors = nbytes = 0
    first_error = ""
    time.sleep(max(0.0, t0 - time.perf_counter()))
    for req, (host, port, head) in zip(reqs, heads, strict=True):
        begin = time.perf_counter()
        ok, got, error = _fetch(conns, req, host, port, head)
        first_error = first_error or error
        if ok:
            count += 1
            nbytes += got
            lat.append(time.perf_counter() - begin)
        else:
            errors += 1
    for c in conns.values():
        c.close()
    out.update(
        count=count, errors=errors, nbytes=nbytes, lat=lat, first_error=first_error,
        end=time.perf_counter(),
    )  # fmt: skip


def _once_process(parts: list[list[Req]], t0: float, queue: object) -> None:
    outs: list[dict[str, object]] = [{} for _ in parts]
    ts = [
        threading.Thread(target=_once_thread, args=(part, t0, out))
        for part, out in zip(parts, outs, strict=True)
    ]
    for t in ts:
        t.start()
    time.sleep(max(0.0, t0 - time.perf_counter()))
    cpu0 = _cpu()
    for t in ts:
        t.join()
    queue.put((outs, _cpu() - cpu0))  # type: ignore[attr-defined]


def run_once(reqs: list[Req], concurrency: int, procs: int = 4) -> Result:
    """Every request of ``reqs`` exactly once (an epoch), ``concurrency`` at a time.

    Connection ``k`` sends ``reqs[k::concurrency]`` one after the other; the
    connections are spread over ``procs`` processes. ``seconds`` is the time
    from the common start to the last answer; client CPU is the processes'.
    """
    concurrency = max(1, min(concurrency, len(reqs)))
    procs = max(1, min(procs, concurrency))
    parts = [reqs[k::concurrency] for k in range(concurrency)]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    t0 = time.perf_counter() + 0.3 + 0.02 * concurrency  # after the forks and connects
    workers = [
        ctx.Process(target=_once_process, args=(parts[p::procs], t0, queue)) for p in range(procs)
    ]
    for w in workers:
        w.start()
    result = Result()
    end = t0
    for _ in workers:
        outs, cpu = queue.get(timeout=3600)
        result.client_cpu += cpu
        for o in outs:
            result.requests += o["count"]
            result.errors += o["errors"]
            result.nbytes += o["nbytes"]
            result.latencies.extend(o["lat"])
            result.first_error = result.first_error or o["first_error"]
            end = max(end, o["end"])
    for w in workers:
        w.join()
    result.seconds = end - t0
    return result
