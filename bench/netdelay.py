"""A TCP proxy on loopback that puts a backend a round trip away, as a cloud bucket is.

The kernel's ``netem`` is not loaded on the machines the benchmarks run on, so
this stands in for it: every chunk read on one side is written on the other
``--rtt-ms / 2`` later, in order (each direction its own queue), and with
``--mbps`` no faster than that per connection. A request therefore waits one
round trip for its first answer byte, the way a GET from S3, GCS or Azure in
the same region does, whatever the backend behind it is (MinIO,
fake-gcs-server, Azurite on loopback answer in a millisecond or two).

``bench/remote.py --backend-rtt-ms`` starts one in front of the backend for the
direct GETs and for Sluice's targets alike, so both pay the same distance;
its CPU is counted with the backend's.

    python bench/netdelay.py --to 127.0.0.1:9000 --rtt-ms 10 [--mbps 0] [--port 0]

It prints its port on the first line of stdout, then serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

CHUNK = 256 << 10


async def pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, rate: float
) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read,
    paced to ``rate`` bytes per second (0: unpaced)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        while chunk := await reader.read(CHUNK):
            queue.put_nowait((time.monotonic() + delay, chunk))
        queue.put_nowait((time.monotonic() + delay, b""))

    async def write() -> None:
        free_at = 0.0  # when the link is free again (pacing)
        while True:
            due, chunk = await queue.get()
            now = time.monotonic()
            if rate:
                due = max(due, free_at)
                free_at = due + len(chunk) / rate
            if due > now:
                await asyncio.sleep(due - now)
            if not chunk:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()

    reading = asyncio.ensure_future(read())
    try:
        await write()
    finally:
        reading.cancel()


async def main(args: argparse.Namespace) -> None:
    host, _, port = args.to.rpartition(":")
    delay, rate = args.rtt_ms / 2000.0, args.mbps * 1e6 / 8

    async def serve(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(host, int(port))
        except OSError:
            cw.close()
            return
        try:
            await asyncio.gather(pipe(cr, uw, delay, 0.0), pipe(ur, cw, delay, rate))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (cw, uw):
                with contextlib.suppress(OSError):
                    w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", args.port)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--to", required=True, help="host:port of the backend")
    ap.add_argument("--rtt-ms", type=float, default=10.0, help="round trip added (ms)")
    ap.add_argument("--mbps", type=float, default=0.0, help="per-connection cap, backend to client")
    ap.add_argument("--port", type=int, default=0)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(ap.parse_args()))
    sys.exit(0)
