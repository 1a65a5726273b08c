"""A stand-in for ``python -m etl_runtime.webserver`` used by controller unit tests.

A real process with a real HTTP server (stdlib), speaking just enough of the
transformer contract: ``--host``/``--port``, ``GET /health`` 200 once "loaded",
exit code 2 with a last stderr line ``sluice: ETL '<name>': <reason>`` when
the spec's code source contains ``raise``. ``GET /env`` echoes the variables
the controller must (and must not) pass.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args()
    name = os.environ.get("SLUICE_ETL_NAME", "?")
    spec = json.loads(os.environ["SLUICE_ETL_SPEC"])
    source = (spec.get("code") or {}).get("source") or ""
    if "raise" in source:
        print("loading code...", flush=True)
        print(f"sluice: ETL '{name}': code failed to load: boom", file=sys.stderr, flush=True)
        sys.exit(2)
    time.sleep(0.2)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                body = json.dumps({"status": "ok", "etl": name}).encode()
            elif self.path == "/env":
                keys = (
                    "SLUICE_ETL_NAME",
                    "SLUICE_ETL_TOKEN",
                    "SLUICE_DEPS_DIR",
                    "SLUICE_CLUSTER_KEY",
                )
                env = {k: os.environ.get(k) for k in keys}
                env.update({k: v for k, v in os.environ.items() if k.startswith("USER_")})
                body = json.dumps(env).encode()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
