"""The chart with ``tls.enabled`` on real nodes, and what a transformer pod can reach.

A second release (two targets, in its own namespace; after ``test_realstack``'s is
gone) with the certificates the chart makes. A client pod, as a training job in
the cluster would be, holds only the chart's ``ca.crt`` and finds the gateway by
its Service name through the cluster DNS (``tests/k8s/clusterdns.py``); every
server names its peers by the names the certificate covers (targets under their
headless Service, transformers as ``A-B-C-D.NAMESPACE.pod``).

What the bridge CNI of these nodes cannot show: that NetworkPolicy is enforced.
The last test shows it is not (docs/deploy.md, "Security"), so a failure there
means the harness's CNI has started to enforce policy and the docs should say so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helm.realstack import RELEASE, STS, TOKEN, Stack, apply_etl, etl_yaml, installed
from tests.k8s.realfixtures import RealNodes
from tests.k8s.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.realnode]

TARGETS = 2
UPPER = etl_yaml("upper", "def transform(data):\n    return data.upper()")
CLIENT = "tls-client"

# Run inside the client pod: writes and reads through the gateway with the CA only,
# follows each redirect by hand, and tries plain HTTP on every TLS port it was given.
PROBE = r"""
import json, ssl, sys
import httpx
from etl_runtime import Client

ns, token, *plain_urls = sys.argv[1:]
ca = "/ca/ca.crt"
gateway = f"https://sl-sluice-gateway.{ns}.svc.cluster.local:8080"
out = {}
with Client(gateway, token=token, ca=ca, timeout=60) as sdk:
    bucket = sdk.bucket("tls-data").create(copies=2)
    bucket.object("hello").put_content(b"hello over tls")
    out["get"] = bucket.object("hello").get_bytes().decode()
    out["etl_get"] = bucket.object("hello").get_bytes(etl_name="upper").decode()
out["hops"] = {}
with httpx.Client(verify=ssl.create_default_context(cafile=ca), timeout=60) as http:
    for query in ("", "?etl_name=upper"):
        chain = [f"{gateway}/v1/objects/tls-data/hello{query}"]
        r = http.get(chain[-1])
        while r.is_redirect:
            chain.append(r.headers["location"])
            r = http.get(chain[-1])
        out["hops"][query or "plain"] = [chain, r.status_code, r.text]


def plain(url):
    try:
        return f"served {httpx.get(url.replace('https://', 'http://', 1), timeout=10).status_code}"
    except httpx.HTTPError as e:
        return type(e).__name__


out["plain_http"] = {u: plain(u) for u in [gateway + "/v1/health", *plain_urls]}
try:
    httpx.get(gateway + "/v1/health", timeout=10)  # the system's CAs only
    out["without_ca"] = "verified"
except httpx.ConnectError as e:
    out["without_ca"] = str(e)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def stack(real_cluster: RealNodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    values = ("--set", "tls.enabled=true")
    yield from installed(real_cluster, tmp_path_factory.mktemp("helm"), values, TARGETS)


def client_pod() -> dict[str, Any]:
    """The server image as a client (Python, the SDK, httpx), with the chart's CA only."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": CLIENT},
        "spec": {
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "client", "image": "localhost/sluice/server:dev",
                "imagePullPolicy": "Never",
                "command": ["python", "-c", "import time; time.sleep(3600)"],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                "volumeMounts": [{"name": "ca", "mountPath": "/ca", "readOnly": True}],
            }],
            "volumes": [{"name": "ca", "secret": {
                "secretName": f"{RELEASE}-sluice-tls",
                "items": [{"key": "ca.crt", "path": "ca.crt"}]}}],
        },
    }  # fmt: skip


def transformer_endpoints(stack: Stack, etl: str) -> list[str]:
    (found,) = [e for e in stack.etls() if e["metadata"]["name"] == etl]
    return [t["endpoint"] for t in found["status"]["transformers"]]


def test_every_hop_is_https_and_a_client_with_the_ca_gets_objects_and_etl_output(
    stack: Stack,
) -> None:
    apply_etl(stack, UPPER, "upper", TARGETS)
    stack.kubectl("apply", "-f", "-", stdin=json.dumps(client_pod()))
    stack.kubectl("wait", "--for=condition=Ready", f"pod/{CLIENT}", "--timeout=120s", timeout=130)
    transformers = transformer_endpoints(stack, "upper")
    assert len(transformers) == TARGETS and all(u.startswith("https://") for u in transformers)
    targets = [f"https://{STS}-{i}.{STS}.{stack.namespace}.svc:8080/v1/health"
               for i in range(TARGETS)]  # fmt: skip
    args = [stack.namespace, TOKEN, *targets, *(u + "/health" for u in transformers)]
    try:
        # Retried: the gateway may not have probed both targets over HTTPS yet.
        raw = wait_for(lambda: stack.kubectl("exec", CLIENT, "--", "python", "-c", PROBE,
                                             *args), 120)  # fmt: skip
    except BaseException:
        print(stack.diagnostics())
        raise
    out = json.loads(raw)
    assert (out["get"], out["etl_get"]) == ("hello over tls", "HELLO OVER TLS")
    for name, want in (("plain", "hello over tls"), ("?etl_name=upper", "HELLO OVER TLS")):
        chain, status, body = out["hops"][name]
        # the gateway's 307 to the target that holds it, by the name its certificate covers
        assert len(chain) >= 2 and all(u.startswith("https://") for u in chain), chain
        assert f".{STS}.{stack.namespace}.svc:8080/" in chain[1], chain
        assert (status, body) == (200, want), (chain, status, body)
    # Plain HTTP to the gateway's, each target's and each transformer's port: the
    # connection is closed, nothing is served.
    assert len(out["plain_http"]) == 1 + 2 * TARGETS
    served = {url: how for url, how in out["plain_http"].items() if how.startswith("served")}
    assert served == {}, out["plain_http"]
    assert "CERTIFICATE_VERIFY_FAILED" in out["without_ca"], out["without_ca"]
    # copies=2: the target that took the PUT wrote the replica to its peer (over HTTPS,
    # the only thing the peer's port speaks).
    for i in range(TARGETS):
        held = stack.kubectl("exec", f"{STS}-{i}", "--", "ls", "/data/buckets/tls-data")
        assert held.split() == ["hello"], (i, held)


def test_a_transformer_pod_has_no_token_runs_non_root_on_a_read_only_root(stack: Stack) -> None:
    probe = (
        "import os; root = [ln.split()[5] for ln in open('/proc/self/mountinfo') "
        "if ln.split()[4] == '/']; "
        "print(os.getuid(), os.getgid(), root[-1].split(',')[0], "
        "os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token'))"
    )
    for pod in stack.pods("sluice.dev/etl=upper"):
        c = pod.spec.containers[0]
        assert c.security_context.read_only_root_filesystem is True
        assert pod.spec.automount_service_account_token is False
        seen = stack.kubectl("exec", pod.metadata.name, "--", "python", "-c", probe).split()
        assert seen == ["10001", "10001", "ro", "False"], (pod.metadata.name, seen)


def test_network_policies_exist_but_the_bridge_cni_does_not_enforce_them(stack: Stack) -> None:
    """The chart's policies select the transformer pods; these nodes' CNI (bridge +
    host-local) ignores them: a transformer beside target 0 connects to target 1's
    port and to the gateway's, which the egress policy does not admit."""
    names = set(stack.kubectl("get", "networkpolicy", "-o", "name").split())
    assert names == {
        f"networkpolicy.networking.k8s.io/{n}"
        for n in (f"{RELEASE}-sluice-transformers", f"{RELEASE}-sluice-transformer-egress",
                  *(f"{STS}-{i}-transformers" for i in range(TARGETS)))
    }  # fmt: skip
    (pod,) = [p for p in stack.pods("sluice.dev/etl=upper")
              if p.metadata.annotations["sluice.dev/target"] == f"{STS}-0"]  # fmt: skip
    others = {
        "target 1": stack.pods(f"statefulset.kubernetes.io/pod-name={STS}-1")[0].status.pod_ip,
        "gateway": stack.pods("app.kubernetes.io/component=gateway")[0].status.pod_ip,
    }
    connect = (
        "import socket, sys\n"
        "for ip in sys.argv[1:]:\n"
        "    s = socket.socket(); s.settimeout(5)\n"
        "    print(s.connect_ex((ip, 8080)) == 0)\n"
    )
    seen = stack.kubectl("exec", pod.metadata.name, "--", "python", "-c", connect,
                         *others.values()).split()  # fmt: skip
    # Not enforced (a CNI that enforces NetworkPolicy would make both False).
    assert dict(zip(others, seen, strict=True)) == {"target 1": "True", "gateway": "True"}
