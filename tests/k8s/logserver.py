"""The one piece of the kubelet HTTP API we serve: container logs.

The apiserver answers ``kubectl logs`` by calling
``https://<node InternalIP>:<kubeletEndpoint port>/containerLogs/<ns>/<pod>/<container>``.
Each fake node serves that path on its own loopback address (self-signed
certificate; the apiserver does not verify kubelet certificates unless told
to).  ``tailLines``, ``limitBytes`` and ``follow`` are honoured; ``previous``
is not (a container's log file holds every run).  Exec, attach and
port-forward are not served.
"""

from __future__ import annotations

import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

PORT = 10250


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate/key pair for the node servers (made once)."""
    cert, key = directory / "kubelet.crt", directory / "kubelet.key"
    if not cert.exists():
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
             "-out", str(cert), "-days", "3650", "-subj", "/CN=sluice-process-kubelet"],
            check=True, capture_output=True,
        )  # fmt: skip
    return cert, key


class LogServer:
    """Serves ``/containerLogs`` on ``host:PORT`` from the kubelet's log files."""

    def __init__(
        self, host: str, cert: tuple[Path, Path], find: Callable[[str, str, str], Path]
    ) -> None:
        find_log = find

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404, "only /containerLogs is served by the process kubelet")
                    return
                try:
                    path = find_log(parts[1], parts[2], parts[3])
                except FileNotFoundError as e:
                    self.send_error(404, str(e))
                    return
                q = {k: v[-1] for k, v in parse_qs(url.query).items()}
                data = path.read_bytes()
                if "tailLines" in q:
                    lines = data.splitlines(keepends=True)
                    data = b"".join(lines[-int(q["tailLines"]) :]) if int(q["tailLines"]) else b""
                if "limitBytes" in q:
                    data = data[: int(q["limitBytes"])]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                follow = q.get("follow") == "true"
                if not follow:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if follow:
                    self._follow(path, path.stat().st_size)

            def _follow(self, path: Path, offset: int) -> None:
                try:
                    while True:
                        with open(path, "rb") as f:
                            f.seek(offset)
                            chunk = f.read()
                        if chunk:
                            offset += len(chunk)
                            self.wfile.write(chunk)
                            self.wfile.flush()
                        time.sleep(0.3)
                except OSError:  # client went away (or the pod dir was removed)
                    return

        self.server = ThreadingHTTPServer((host, PORT), Handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
