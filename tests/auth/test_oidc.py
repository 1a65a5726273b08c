"""JWTs of an OIDC issuer on a 3-target ``sluice up --oidc-issuer``, with a user and a read token.

The issuer is a real HTTP server on loopback (its discovery document and
``jwks.json``, keys made with ``cryptography``). A JWT whose ``scope`` grants
``bucket:B:read``/``bucket:B:write`` is held to those buckets like a token of
``sluice token create``: 403 naming the bucket outside them, on the gateway and
on each target; expired, for another audience or issuer, ``alg: none`` or HS256
"signed" with the public key: 401. A new key (kid) is fetched once; with the
issuer down the cached keys still check tokens, and an unknown kid is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from etl_runtime import Client, Forbidden
from etl_runtime.core import oidc
from etl_runtime.local import LocalCluster
from etl_runtime.local.up import parse_args
from tests.auth.test_scoped_tokens import ADMIN, READER, bearer, forbidden, targets, upcase

pytestmark = pytest.mark.timeout(300)
AUDIENCE = "sluice-test"
REFRESH = 1.0  # SLUICE_OIDC_REFRESH: seconds between two loads of the keys


class Issuer:
    """An OIDC issuer on loopback: discovery, JWKS (``keys``), and ``down`` for a 503."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}  # kid -> private key
        self.down = False
        self.fetches = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if issuer.down:
                    self.send_error(503)
                    return
                if self.path == "/.well-known/openid-configuration":
                    body: dict[str, Any] = {
                        "issuer": issuer.url,
                        "jwks_uri": f"{issuer.url}/jwks.json",
                    }
                elif self.path == "/jwks.json":
                    issuer.fetches += 1
                    body = {"keys": [issuer.jwk(kid) for kid in issuer.keys]}
                else:
                    self.send_error(404)
                    return
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, kid: str, kind: str = "rsa") -> None:
        made = ec.generate_private_key(ec.SECP256R1()) if kind == "ec" else None
        self.keys[kid] = made or rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(self, kid: str) -> dict[str, Any]:
        public = self.keys[kid].public_key()
        if isinstance(public, ec.EllipticCurvePublicKey):
            entry = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(public))
        else:
            entry = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))
        return {**entry, "kid": kid, "use": "sig"}

    def token(self, scope: str, kid: str = "r1", alg: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": self.url, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 600}
        body.update(scope=scope, **claims)
        return jwt.encode(body, self.keys[kid], algorithm=alg, headers={"kid": kid})

    def pem(self, kid: str) -> bytes:
        return bytes(
            self.keys[kid]
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    made = Issuer()
    made.add("r1")
    made.add("e1", "ec")
    yield made
    made.server.shutdown()


@pytest.fixture(scope="module")
def up(issuer: Issuer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("oidc") / "data"
    with pytest.MonkeyPatch.context() as env:  # sluice up reads them (its flags' defaults)
        env.setenv("SLUICE_OIDC_ISSUER", issuer.url)
        env.setenv("SLUICE_OIDC_AUDIENCE", AUDIENCE)
        env.setenv("SLUICE_OIDC_ADMIN", "sluice:admin")
        env.setenv("SLUICE_OIDC_REFRESH", str(REFRESH))
        with LocalCluster(data, targets=3, token=ADMIN, read_token=READER) as c:
            with Client(c.endpoint, token=ADMIN) as admin:
                for b in ("mine", "theirs"):
                    bucket = admin.bucket(b).create()
                    bucket.object("o1.txt").put_content(f"{b} o1".encode())
                admin.etl("upcase").init_code(transform=upcase)
            yield c


def compact(header: dict[str, Any], body: dict[str, Any], signature: bytes) -> str:
    """A JWS by hand: what PyJWT will not make (``alg: none``, HS256 with a PEM secret)."""

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    parts = [json.dumps(header).encode(), json.dumps(body).encode(), signature]
    return ".".join(b64(p) for p in parts)


def refused(r: httpx.Response, says: str) -> None:
    assert r.status_code == 401, (r.status_code, r.text)
    assert says in r.json()["error"], r.text


def test_a_jwt_reads_and_writes_its_buckets_only(up: LocalCluster, issuer: Issuer) -> None:
    reader = issuer.token("openid bucket:mine:read")
    writer = issuer.token("bucket:mine:write bucket:theirs:read", kid="e1", alg="ES256")
    with Client(up.endpoint, token=reader) as sdk:
        assert sdk.bucket("mine").object("o1.txt").get_bytes() == b"mine o1"
        with pytest.raises(Forbidden) as err:
            sdk.bucket("theirs").object("o1.txt").get_bytes()
        assert err.value.status == 403 and err.value.bucket == "theirs"
    with httpx.Client(base_url=up.endpoint, follow_redirects=True, timeout=30) as http:
        forbidden(http.put("/v1/objects/mine/new", content=b"x", headers=bearer(reader)), "mine")
        r = http.put("/v1/objects/mine/new", content=b"written", headers=bearer(writer))
        assert r.status_code == 200, r.text
        assert http.get("/v1/objects/mine/new", headers=bearer(reader)).content == b"written"
        assert http.get("/v1/objects/theirs/o1.txt", headers=bearer(writer)).content == b"theirs o1"
        forbidden(http.put("/v1/objects/theirs/x", content=b"x", headers=bearer(writer)), "theirs")
        r = http.get("/v1/buckets", headers=bearer(writer))  # cluster-wide: not for a scope
        assert r.status_code == 403 and r.json()["kind"] == "Forbidden", r.text
        admin = issuer.token("sluice:admin")  # SLUICE_OIDC_ADMIN: the user token's rights
        r = http.get("/v1/buckets", headers=bearer(admin))
        assert {"mine", "theirs"} <= set(r.json()["buckets"]), r.text
    for t in targets(up):  # each target checks the JWT itself
        forbidden(httpx.get(f"{t}/v1/objects/theirs/o1.txt", headers=bearer(reader)), "theirs")
        r = httpx.get(f"{t}/v1/objects/mine/o1.txt", headers=bearer(reader), follow_redirects=True)
        assert r.content == b"mine o1"


def test_getbatch_and_etl_gets_check_every_bucket(up: LocalCluster, issuer: Issuer) -> None:
    reader = issuer.token("bucket:mine:read")
    with Client(up.endpoint, token=reader) as sdk:
        assert [i.data for i in sdk.get_batch([("mine", "o1.txt")])] == [b"mine o1"]
        with pytest.raises(Forbidden) as err:
            list(sdk.get_batch([("mine", "o1.txt"), ("theirs", "o1.txt")]))
        assert err.value.bucket == "theirs"
    query = {"etl_name": "upcase"}
    r = httpx.get(
        f"{up.endpoint}/v1/objects/mine/o1.txt",
        params=query,
        headers=bearer(reader),
        follow_redirects=True,
    )
    assert r.content == b"MINE O1"
    for base in [up.endpoint, *targets(up)]:
        r = httpx.get(f"{base}/v1/objects/theirs/o1.txt", params=query, headers=bearer(reader))
        forbidden(r, "theirs")
        body = {"in": [{"objname": "o1.txt", "bucket": "theirs"}], "strm": True}
        r = httpx.request("GET", f"{base}/v1/ml/moss/mine", json=body, headers=bearer(reader))
        forbidden(r, "theirs")


def test_bad_jwts_are_401s(up: LocalCluster, issuer: Issuer) -> None:
    scope = "bucket:mine:read"
    now = int(time.time())
    url = f"{up.endpoint}/v1/objects/mine/o1.txt"
    expired = issuer.token(scope, exp=now - 120, iat=now - 900)
    refused(httpx.get(url, headers=bearer(expired)), "expired")
    refused(httpx.get(url, headers=bearer(issuer.token(scope, aud="another-app"))), "audience")
    refused(httpx.get(url, headers=bearer(issuer.token(scope, iss="https://evil"))), "issuer")
    later = issuer.token(scope, nbf=now + 600)
    refused(httpx.get(url, headers=bearer(later)), "not valid yet")
    body = {"iss": issuer.url, "aud": AUDIENCE, "exp": now + 600, "scope": scope}
    unsigned = compact({"alg": "none", "kid": "r1"}, body, b"")
    refused(httpx.get(url, headers=bearer(unsigned)), "'none'")
    # The classic confusion: HS256 with the issuer's public key as the HMAC secret.
    header = {"alg": "HS256", "kid": "r1", "typ": "JWT"}
    signing = compact(header, body, b"").rstrip(".").encode()
    forged = compact(header, body, hmac.new(issuer.pem("r1"), signing, hashlib.sha256).digest())
    refused(httpx.get(url, headers=bearer(forged)), "'HS256'")
    # An ES256 token naming the RSA key, and one signed by a key the issuer never had.
    crossed = jwt.encode(body, issuer.keys["e1"], algorithm="ES256", headers={"kid": "r1"})
    refused(httpx.get(url, headers=bearer(crossed)), "does not match its key")
    other = Issuer()
    other.add("r1")
    stranger = jwt.encode(body, other.keys["r1"], algorithm="RS256", headers={"kid": "r1"})
    other.server.shutdown()
    refused(httpx.get(url, headers=bearer(stranger)), "does not verify")
    for t in targets(up):
        refused(httpx.get(f"{t}/v1/objects/mine/o1.txt", headers=bearer(expired)), "expired")
        refused(httpx.put(f"{t}/v1/objects/mine/x", headers=bearer(forged)), "'HS256'")


def test_a_new_key_is_fetched_and_a_down_issuer_keeps_the_last(
    up: LocalCluster, issuer: Issuer
) -> None:
    url = f"{up.endpoint}/v1/objects/mine/o1.txt"
    old = issuer.token("bucket:mine:read")
    assert httpx.get(url, headers=bearer(old), follow_redirects=True).content == b"mine o1"
    time.sleep(REFRESH + 0.2)
    issuer.add("r2")  # rotated: the issuer signs with a new key
    new = issuer.token("bucket:mine:read", kid="r2")
    before = issuer.fetches
    for _ in range(5):
        assert httpx.get(url, headers=bearer(new), follow_redirects=True).content == b"mine o1"
    assert 1 <= issuer.fetches - before <= 4  # the gateway and the owner, once each at most
    fetched = issuer.fetches
    for _ in range(10):  # an unknown kid: a 401, and no fetch per request
        refused(httpx.get(url, headers=bearer(issuer_token_unknown(issuer))), "'nope'")
    assert issuer.fetches - fetched <= 2
    issuer.down = True
    try:
        time.sleep(REFRESH + 0.2)
        for token in (old, new):  # the cached keys still check tokens
            r = httpx.get(url, headers=bearer(token), follow_redirects=True)
            assert r.content == b"mine o1", r.text
        refused(httpx.get(url, headers=bearer(issuer_token_unknown(issuer))), "'nope'")
    finally:
        issuer.down = False


def issuer_token_unknown(issuer: Issuer) -> str:
    """A token for a kid the issuer does not publish (signed with one it does)."""
    now = int(time.time())
    body = {"iss": issuer.url, "aud": AUDIENCE, "exp": now + 600, "scope": "bucket:mine:read"}
    return jwt.encode(body, issuer.keys["r1"], algorithm="RS256", headers={"kid": "nope"})


def test_sluice_up_refuses_an_oidc_setting_that_cannot_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLUICE_TOKEN", "SLUICE_READ_TOKEN", "SLUICE_OIDC_JWKS", "SLUICE_OIDC_AUDIENCE"):
        monkeypatch.delenv(name, raising=False)
    for argv, says in (
        (["--oidc-issuer", "https://idp", "--token", "t"], "--oidc-audience"),
        (["--oidc-issuer", "http://idp.example", "--oidc-audience", "a", "--token", "t"], "https"),
        (["--oidc-issuer", "https://idp", "--oidc-audience", "a"], "--token"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert says in capsys.readouterr().err


def test_the_claim_maps_to_buckets_and_admin_by_its_configured_name() -> None:
    roles = oidc.Issuer("https://idp", "aud", claim="realm_access.roles", admin="ops")
    body = {"exp": 1, "sub": "bob", "realm_access": {"roles": ["bucket:a:write", "bucket:b:read"]}}
    got = roles.grants(body)
    assert got.buckets == ("a", "b") and got.may("write", "a") and not got.may("write", "b")
    assert got.may("read", "b") and not got.may("read", "c") and not got.admin
    assert got.id == "oidc:bob"
    assert roles.grants({"exp": 1, "realm_access": {"roles": ["ops"]}}).admin
    scope = oidc.Issuer("https://idp", "aud")  # the default: the space-separated 'scope'
    got = scope.grants({"exp": 1, "scope": "openid bucket:x:y:read bucket:z:admin ops"})
    assert got.buckets == ("x:y",) and got.writable == () and not got.admin


def test_the_chart_hands_the_issuer_to_gateway_and_targets() -> None:
    from tests.helm.chart import CHART, container, env_of, helm, render, set_args

    values = {
        "auth.token": "t",
        "auth.oidc.issuer": "https://idp.example",
        "auth.oidc.audience": "a",
    }
    m = render({**values, "auth.oidc.admin": "ops"})
    for kind, comp in (("StatefulSet", "target"), ("Deployment", "gateway")):
        env = env_of(container(m.component(kind, comp)))
        got = {k: env[k]["value"] for k in env if k.startswith("SLUICE_OIDC_")}
        assert got == {
            "SLUICE_OIDC_ISSUER": "https://idp.example",
            "SLUICE_OIDC_AUDIENCE": "a",
            "SLUICE_OIDC_CLAIM": "scope",
            "SLUICE_OIDC_ADMIN": "ops",
        }
    assert not any(
        k.startswith("SLUICE_OIDC_")
        for k in env_of(container(m.component("Deployment", "operator")))
    )
    del values["auth.oidc.audience"]
    proc = helm("template", "x", str(CHART), *set_args(values), check=False)
    assert proc.returncode != 0 and "auth.oidc.audience is required" in proc.stderr


def test_a_jwks_file_is_read_again_for_a_new_kid_and_a_broken_one_keeps_the_keys(
    tmp_path: Any,
) -> None:
    made = Issuer()  # only its keys and tokens: the file stands in for the issuer
    made.server.shutdown()
    made.add("r1")
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [made.jwk("r1")]}))
    checker = oidc.Issuer(made.url, AUDIENCE, jwks_file=str(jwks), refresh=0)
    first = made.token("bucket:mine:write")
    assert checker.missing_key(first) == (True, "r1")
    checker.refresh("r1")
    assert checker.verify(first).may("write", "mine")
    made.add("r2")
    jwks.write_text("{not json")  # a broken file: the last good keys stay
    second = made.token("bucket:mine:read", kid="r2")
    checker.refresh("r2")
    assert checker.verify(first).buckets == ("mine",)
    with pytest.raises(oidc.TokenError, match="'r2' is not among"):
        checker.verify(second)
    jwks.write_text(json.dumps({"keys": [made.jwk("r1"), made.jwk("r2")]}))
    checker.refresh("r2")
    assert not checker.verify(second).may("write", "mine")


def test_hostile_jwts_are_token_errors_never_a_crash(tmp_path: Any) -> None:
    made = Issuer()
    made.server.shutdown()
    made.add("r1")
    jwks = tmp_path / "jwks.json"
    broken = {"kty": "RSA", "kid": "bad", "n": "!!", "e": "AQAB"}
    jwks.write_text(json.dumps({"keys": [made.jwk("r1"), broken, {"kty": "oct", "k": "c2VjcmV0"}]}))
    checker = oidc.Issuer(made.url, AUDIENCE, jwks_file=str(jwks), refresh=0)
    checker.refresh()
    assert list(checker.keys) == ["r1"]  # the broken key and the symmetric one are not loaded
    body = {"iss": made.url, "aud": AUDIENCE, "exp": int(time.time()) + 60}
    for header in (
        {"alg": "RS256", "kid": {"a": 1}},
        {"alg": ["RS256"], "kid": "r1"},
        {"alg": "RS256", "kid": ["r1"]},
        {"alg": "HS512", "kid": "bad"},
    ):
        token = compact(header, body, b"sig")
        checker.missing_key(token)
        with pytest.raises(oidc.TokenError):
            checker.verify(token)
    for garbage in ("eyJ.e.e", "eyJhbGciOiJSUzI1NiJ9.!!.x", "eyJ9" + "." * 2):
        assert checker.missing_key(garbage)[0] is False
        with pytest.raises(oidc.TokenError):
            checker.verify(garbage)
