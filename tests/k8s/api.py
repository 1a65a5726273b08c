"""A small JSON client for the kube-apiserver, used by the process kubelet.

The kubelet works on plain dicts (the wire format) rather than the
``kubernetes`` client's model classes: it copies fields between objects,
patches status with strategic-merge patches and streams watches, all of which
are simpler on raw JSON.  Tests themselves should use the official client
(``tests.k8s.fixtures``) or kubectl.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

JSON = dict[str, Any]


class ApiError(RuntimeError):
    """The apiserver answered with an error status."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"apiserver {status}: {body[:300]}")
        self.status = status


class Api:
    """Admin access to one apiserver, configured from a kubeconfig file."""

    def __init__(self, kubeconfig: Path | str, timeout: float = 30.0) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg["current-context"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server: str = cluster["server"]
        self.ca_file: str = cluster["certificate-authority"]
        sslctx = ssl.create_default_context(cafile=self.ca_file)
        sslctx.load_cert_chain(user["client-certificate"], user["client-key"])
        self._ssl = sslctx
        self.http = httpx.Client(base_url=self.server, verify=sslctx, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _check(self, r: httpx.Response) -> JSON:
        if r.status_code >= 400:
            raise ApiError(r.status_code, r.text)
        return r.json() if r.content else {}

    def get(self, path: str, **params: Any) -> JSON:
        return self._check(self.http.get(path, params=params))

    def get_or_none(self, path: str) -> JSON | None:
        r = self.http.get(path)
        return None if r.status_code == 404 else self._check(r)

    def post(self, path: str, body: JSON) -> JSON:
        return self._check(self.http.post(path, json=body))

    def put(self, path: str, body: JSON) -> JSON:
        return self._check(self.http.put(path, json=body))

    def patch(self, path: str, body: JSON, kind: str = "strategic-merge-patch") -> JSON:
        return self._check(
            self.http.patch(
                path, content=json.dumps(body), headers={"Content-Type": f"application/{kind}+json"}
            )
        )

    def delete(self, path: str, body: JSON | None = None) -> JSON | None:
        r = self.http.request("DELETE", path, json=body)
        return None if r.status_code == 404 else self._check(r)

    def watch(self, path: str, resource_version: str, timeout: int = 60) -> Iterator[JSON]:
        """Yield watch events (``{"type", "object"}``) until the server ends the watch."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
        }
        with httpx.Client(base_url=self.server, verify=self._ssl, timeout=timeout + 30) as http:
            with http.stream("GET", path, params=params) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ApiError(r.status_code, r.text)
                for line in r.iter_lines():
                    if line.strip():
                        yield json.loads(line)
