"""``Etl``: what ``init_code``/``init_spec`` send, polling to Running, and code pickling."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator

import cloudpickle
import pytest

from etl_runtime import BadRequest, Client, EtlError, NotFound
from etl_runtime.core.spec import EtlSpec
from etl_runtime.sdk.etl import pickle_transform
from tests.sdk import transforms_helper
from tests.sdk.fake_cluster import State, fake_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, State]]:
    with fake_cluster() as (url, state):
        yield url, state


@pytest.fixture
def client(cluster: tuple[str, State]) -> Iterator[Client]:
    with Client(cluster[0]) as c:
        yield c


def test_init_code_sends_a_pickled_closure_and_waits_for_running(client, cluster) -> None:
    _, state = cluster
    factor = 3

    def repeat(data: bytes) -> bytes:
        return data * factor

    details = client.etl("rep").init_code(
        transform=repeat,
        on_error="skip",
        dependencies=["six==1.16.0"],
        workers=2,
        env={"A": "1"},
        timeout=10,
    )
    assert details.phase == "Running" and (details.ready, details.total) == (3, 3)
    assert state.polls["rep"] == 3  # polled through Initializing

    sent = state.etls["rep"]
    spec = EtlSpec.from_dict(sent)  # the shared schema accepts exactly what we sent
    assert spec.on_error == "skip" and spec.workers == 2 and spec.env == (("A", "1"),)
    assert sent["code"]["pythonVersion"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert sent["dependencies"] == ["six==1.16.0"] and sent["onError"] == "skip"
    fn = cloudpickle.loads(base64.b64decode(sent["code"]["pickled"]))
    assert fn(b"ab") == b"ababab"


def test_init_spec_sends_source_and_entrypoint(client, cluster) -> None:
    source = "def up(data):\n    return data.upper()\n"
    client.etl("src").init_spec(source=source, entrypoint="up", mode="wds", decode="pil")
    sent = cluster[1].etls["src"]
    assert sent["code"] == {"source": source, "entrypoint": "up"}
    assert (sent["mode"], sent["decode"]) == ("wds", "pil")


def test_a_gateway_without_wait_is_polled(client, cluster) -> None:
    """A gateway older than ``GET /v1/etl/{n}?wait=`` refuses the parameter: the SDK polls."""
    details = client.etl("old-gw").init_code(transform=lambda d: d, timeout=10)
    assert details.phase == "Running" and cluster[1].polls["old-gw"] == 3  # polled without it


def test_phase_error_raises_with_the_servers_message(client) -> None:
    with pytest.raises(EtlError) as exc_info:
        client.etl("broken-1").init_code(transform=lambda d: d, timeout=10)
    assert exc_info.value.message == "boom: cannot load code"
    assert (exc_info.value.etl, exc_info.value.phase) == ("broken-1", "Error")


def test_timeout_names_the_last_phase(client) -> None:
    with pytest.raises(EtlError) as exc_info:
        client.etl("slow").init_code(transform=lambda d: d, timeout=0.5)
    assert "not Running after 0.5s" in str(exc_info.value)
    assert "Initializing, 1/3 transformers ready" in str(exc_info.value)


def test_invalid_spec_is_a_bad_request_from_the_gateway(client) -> None:
    with pytest.raises(BadRequest) as exc_info:
        client.etl("bad-mode").init_code(transform=lambda d: d, mode="batch")
    assert "spec.mode" in exc_info.value.message and exc_info.value.etl == "bad-mode"


def test_unknown_etl_is_not_found(client) -> None:
    with pytest.raises(NotFound) as exc_info:
        client.etl("ghost").details()
    assert exc_info.value.etl == "ghost" and "'ghost'" in exc_info.value.message


def test_functions_from_local_modules_are_pickled_by_value(tmp_path) -> None:
    """A transformer cannot import ``tests.sdk.transforms_helper``: the pickle must not need it."""
    blob = pickle_transform(transforms_helper.shout)
    script = (
        "import base64, sys, cloudpickle\n"
        "fn = cloudpickle.loads(base64.b64decode(sys.stdin.read()))\n"
        "sys.stdout.write(fn(b'hi').decode())\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", script],  # -I: no cwd/PYTHONPATH on sys.path
        input=blob,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    assert out.stdout == "HI!"
    # Registration is temporary: the module is pickled by reference again afterwards.
    assert not cloudpickle.cloudpickle._is_registered_pickle_by_value(transforms_helper)


def test_library_functions_stay_pickled_by_reference() -> None:
    import json

    blob = base64.b64decode(pickle_transform(json.dumps))
    assert len(blob) < 100  # a reference, not the json module's code
