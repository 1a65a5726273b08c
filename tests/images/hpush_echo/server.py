"""An AIStore-style hpush ETL server (stdlib only): upper-cases or md5s objects.

``PUT /<bucket>/<object>``: the body (or, with ``?etl_fqn=``, that file) is the
object; ``?etl_args=md5`` answers its md5 hex digest, ``?etl_args=request`` what
it was sent (JSON: headers, query, body length), anything else the upper-cased
bytes. An object whose name contains ``fail`` gets a 500 with a message, ``busy``
a 503, ``direct`` a 204 (AIStore's "delivered by direct put"). ``GET /health``:
``Running``; with ``FAIL_HEALTH=1`` in the environment it answers 503 forever (an
image that never becomes ready). Listens on ``$HOST:$PORT`` (default 0.0.0.0:8000,
AIStore's port).
"""

import hashlib
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _answer(self, status, body, ctype="application/octet-stream"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if urlparse(self.path).path == "/health":
            if os.environ.get("FAIL_HEALTH") == "1":
                self._answer(503, b"not healthy, on purpose", "text/plain")
            else:
                self._answer(200, b"Running", "text/plain")
            return
        self._answer(400, b"hpull is not served here", "text/plain")

    def do_PUT(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        if "etl_fqn" in query:
            with open(unquote(query["etl_fqn"][0]), "rb") as f:
                data = f.read()
        if "fail" in url.path:
            self._answer(500, f"cannot transform {unquote(url.path)}".encode(), "text/plain")
            return
        if "busy" in url.path:
            self._answer(503, b"too busy", "text/plain")
            return
        if "direct" in url.path:
            self._answer(204, b"")
            return
        args = query.get("etl_args", [""])[0]
        if args == "request":
            seen = {"headers": dict(self.headers), "query": query, "length": len(data)}
            self._answer(200, json.dumps(seen).encode(), "application/json")
            return
        out = hashlib.md5(data).hexdigest().encode() if args == "md5" else data.upper()
        self._answer(200, out)


if __name__ == "__main__":
    where = (os.environ.get("HOST", "0.0.0.0"), int(os.environ.get("PORT", "8000")))
    ThreadingHTTPServer(where, Handler).serve_forever()
