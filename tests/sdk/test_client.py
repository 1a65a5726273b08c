"""The SDK against a small real gateway + target (tests/sdk/fake_cluster.py).

What is pinned here is what the SDK puts on the wire and how it reads answers:
redirects and tokens, URL/arg encoding, pagination, error mapping, cut streams.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator

import httpx
import pytest

from etl_runtime import (
    BadRequest,
    Client,
    Conflict,
    EtlError,
    HTTPError,
    NetworkError,
    NotFound,
    ServerError,
    SluiceError,
    StreamError,
    TransformError,
    Unauthorized,
)
from tests.sdk.fake_cluster import TOKEN, State, fake_cluster
from tests.servers import free_port


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, State]]:
    with fake_cluster() as (url, state):
        yield url, state


@pytest.fixture
def client(cluster: tuple[str, State]) -> Iterator[Client]:
    with Client(cluster[0]) as c:
        yield c


def test_put_get_roundtrip_sends_the_body_only_to_the_target(client, cluster) -> None:
    _, state = cluster
    bucket = client.bucket("bkt-rt").create()
    state.gateway_bodies.clear()
    info = bucket.object("dir/a b.txt").put_content(b"hello world")
    assert info.size == 11 and info.name == "dir/a b.txt"
    assert state.gateway_bodies == [b""]  # the gateway only redirects
    assert bucket.object("dir/a b.txt").get_bytes() == b"hello world"
    assert state.buckets["bkt-rt"] == {"dir/a b.txt": b"hello world"}


def test_put_file_streams_with_content_length_and_keeps_the_token(tmp_path) -> None:
    payload = bytes(range(256)) * 12_000  # ~3 MB
    path = tmp_path / "blob.bin"
    path.write_bytes(payload)
    with fake_cluster(token=TOKEN) as (url, state):
        state.buckets["secure"] = {}
        with Client(url, token=TOKEN) as client:
            obj = client.bucket("secure").object("blob.bin")
            assert obj.put_file(path).size == len(payload)
            assert obj.put_content(b"small").size == 5
        assert state.buckets["secure"]["blob.bin"] == b"small"
        assert state.target_puts[0]["length"] == str(len(payload))
        with Client(url) as anonymous:
            with pytest.raises(Unauthorized) as exc_info:
                anonymous.bucket("secure").object("x").put_content(b"nope")
            assert exc_info.value.status == 401
            # Reads do not need the token.
            assert anonymous.bucket("secure").object("blob.bin").get_bytes() == b"small"
        assert "x" not in state.buckets["secure"]


def test_etl_args_dict_is_compact_json_and_survives_url_encoding(client) -> None:
    obj = client.bucket("args").create().object("o")
    obj.put_content(b"data")
    args = {"size": 224, "text": "a b&c=d/é?#"}
    expected = json.dumps(args, separators=(",", ":"))
    assert obj.get_bytes(etl_name="echo-args", etl_args=args).decode() == expected
    assert obj.get_bytes(etl_name="echo-args", etl_args="raw;str+1").decode() == "raw;str+1"
    # The plain URL carries the same thing, for curl/webdataset.
    url = obj.url(etl_name="echo-args", etl_args=args)
    assert httpx.get(url, follow_redirects=True).text == expected
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query == {"etl_name": ["echo-args"], "etl_args": [expected]}


def test_object_names_are_escaped_but_keep_slashes(client) -> None:
    obj = client.bucket("names").create().object("a/b c/100%?#.txt")
    assert obj.url() == f"{client.endpoint}/v1/objects/names/a/b%20c/100%25%3F%23.txt"
    obj.put_content(b"1")
    assert [o.name for o in client.bucket("names").list_objects()] == ["a/b c/100%?#.txt"]


def test_dot_dot_reaches_the_server_and_is_refused(client) -> None:
    with pytest.raises(BadRequest) as exc_info:
        client.bucket("names").object("a/../b").put_content(b"x")
    assert "a/../b" in exc_info.value.message
    assert exc_info.value.bucket == "names"


def test_list_objects_walks_every_page(client) -> None:
    bucket = client.bucket("many").create()
    names = [f"p/{i:03d}" for i in range(25)] + ["q/0"]
    for name in names:
        bucket.object(name).put_content(name.encode())
    listed = list(bucket.list_objects(prefix="p/", page_size=10))
    assert [o.name for o in listed] == names[:25]
    assert listed[3].size == 5 and listed[3].etag == "e-p/003"
    assert len(list(bucket.list_objects(page_size=7))) == 26
    assert "many" in client.list_buckets()
    urls = bucket.list_urls(prefix="q/", etl_name="up")
    assert urls == [f"{client.endpoint}/v1/objects/many/q/0?etl_name=up"]


def test_object_urls_brace_expand_like_webdataset(client) -> None:
    urls = client.bucket("bkt-ds").object_urls("shard-{000..002}.tar", etl_name="resize")
    base = f"{client.endpoint}/v1/objects/bkt-ds/shard-"
    assert urls == [f"{base}{i:03d}.tar?etl_name=resize" for i in range(3)]
    assert client.bucket("bkt-ds").object_urls("{a,b}/x") == [
        f"{client.endpoint}/v1/objects/bkt-ds/a/x",
        f"{client.endpoint}/v1/objects/bkt-ds/b/x",
    ]


def test_bucket_create_exists_delete(client) -> None:
    bucket = client.bucket("lifecycle")
    assert not bucket.exists()
    bucket.create()
    assert bucket.exists()
    bucket.create(exist_ok=True)
    with pytest.raises(Conflict):
        bucket.create(exist_ok=False)


def test_errors_are_typed_and_carry_context(client) -> None:
    with pytest.raises(NotFound) as nf:
        list(client.bucket("nope").list_objects())
    assert nf.value.bucket == "nope" and "'nope'" in nf.value.message and nf.value.status == 404
    assert nf.value.kind == "NotFound"

    obj = client.bucket("errs").create().object("o")
    obj.put_content(b"x")
    with pytest.raises(NotFound) as nf:
        obj.get_bytes(etl_name="missing")
    assert nf.value.etl == "missing" and nf.value.object == "o"

    with pytest.raises(Conflict) as cf:
        obj.get_bytes(etl_name="stopped")
    assert "stopped" in cf.value.message

    with pytest.raises(TransformError) as tf:
        obj.get_bytes(etl_name="fails")
    err = tf.value
    assert isinstance(err, EtlError) and isinstance(err, ServerError)
    assert (err.status, err.sample, err.etl) == (422, "s-007", "fails")
    assert "ValueError" in str(err)

    # HEAD has no body: the message is built from what we asked for.
    with pytest.raises(NotFound) as nf:
        client.bucket("errs").object("ghost").head()
    assert nf.value.message == "object 'errs/ghost' not found"
    assert not client.bucket("errs").object("ghost").exists()
    assert issubclass(NotFound, HTTPError) and issubclass(HTTPError, SluiceError)


def test_head_reports_size_and_clean_etag(client) -> None:
    obj = client.bucket("head").create().object("o")
    obj.put_content(b"12345")
    info = obj.head()
    assert (info.size, info.etag) == (5, "x1")
    assert info.mtime == 1445412480.0


@pytest.mark.parametrize("name", ["cut", "cut-length"])
def test_a_cut_stream_raises_instead_of_returning_short_data(client, name) -> None:
    obj = client.bucket("cut").create().object(name)
    with pytest.raises(StreamError):
        obj.get_bytes()
    # Read in small pieces too: the error comes at the break, never as a quiet EOF.
    with pytest.raises(StreamError), obj.open() as reader:
        while reader.read(100):
            pass


def test_open_is_a_streaming_file_like(client) -> None:
    obj = client.bucket("stream").create().object("big")
    payload = b"0123456789" * 500_000
    obj.put_content(payload)
    with obj.open() as reader:
        assert reader.size == len(payload) and reader.etag == "x1"
        assert reader.read(3) == b"012"
        rest = reader.read()
    assert b"012" + rest == payload
    assert reader.closed


def test_unreachable_cluster_is_a_network_error() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", timeout=2, retries=0) as c:
        with pytest.raises(NetworkError) as exc_info:
            c.list_buckets()
    assert "127.0.0.1" in str(exc_info.value)


def test_defaults_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_ENDPOINT", "http://example.invalid:1234/")
    monkeypatch.setenv("SLUICE_TOKEN", "tok")
    with Client() as c:
        assert c.endpoint == "http://example.invalid:1234"
        assert c._http.headers["authorization"] == "Bearer tok"
    monkeypatch.delenv("SLUICE_ENDPOINT")
    monkeypatch.delenv("SLUICE_TOKEN")
    with Client() as c:
        assert c.endpoint == "http://127.0.0.1:8080" and "authorization" not in c._http.headers
