"""AIStore's ETL init message -> ``EtlSpec`` (``gateway/aisetl.py``), from the
bodies the official aistore SDK really sends, and the 400s naming the field."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import cloudpickle
import pytest

from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core.errors import EtlInitFailed, InvalidSpec
from etl_runtime.core.spec import EtlSpec, runtime_python_version
from etl_runtime.gateway import aisetl
from etl_runtime.gateway.aisetl import is_ais_message, to_spec
from tests.gateway.conftest import Cluster

aistore = pytest.importorskip("aistore")
from aistore.sdk.etl.etl import Etl  # noqa: E402
from aistore.sdk.etl.webserver.fastapi_server import FastAPIServer  # noqa: E402


class Sent:
    """Stands in for the SDK's request client: keeps the JSON of each request."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        assert (method.upper(), path) == ("PUT", "etl")
        self.bodies.append(kwargs["json"])
        return type("Resp", (), {"text": "job"})()


def sdk_body(call: str = "init_class", **kwargs: Any) -> dict[str, Any]:
    """What ``client.etl("md5-etl").<call>(**kwargs)`` puts on the wire."""
    sent = Sent()
    etl = Etl(sent, "md5-etl")  # type: ignore[arg-type]
    if call == "init_class":

        class Md5(FastAPIServer):
            def transform(self, data: bytes, path: str, etl_args: str) -> bytes:
                return data

        etl.init_class(**kwargs)(Md5)
    else:
        etl.init(**kwargs)
    (body,) = sent.bodies
    return body


def refusal(body: dict[str, Any], platform: str = "local") -> str:
    with pytest.raises(InvalidSpec) as e:
        if is_ais_message(body):
            to_spec(body, platform)
    assert e.value.status == 400 and e.value.context.get("etl") == body.get("name")
    return e.value.message


def test_init_class_becomes_a_class_spec() -> None:
    body = sdk_body(
        dependencies=["xxhash", "six>=1.16"],
        init_timeout="150s",
        obj_timeout="20s",
        NUM_WORKERS=3,
        MY_SETTING="on",
    )
    assert is_ais_message(body)
    name, spec = to_spec(body)
    assert name == "md5-etl" and spec.mode == "object"
    assert spec.code.ais_class and spec.code.python_version == runtime_python_version()
    cls = cloudpickle.loads(base64.b64decode(spec.code.ais_class))
    assert cls.__name__ == "Md5" and issubclass(cls, FastAPIServer)
    assert spec.dependencies == ("xxhash", "six>=1.16")
    assert spec.workers == 3 and spec.arg_type == ""
    assert (spec.init_timeout_seconds, spec.request_timeout_seconds) == (150.0, 20.0)
    assert dict(spec.env) == {"MY_SETTING": "on"}  # the SDK's own variables are consumed
    assert EtlSpec.from_dict(spec.to_dict()) == spec  # a spec like any other


def test_durations_are_gos() -> None:
    body = {**sdk_body(), "init_timeout": "1m30s", "obj_timeout": "1.5s"}
    _, spec = to_spec(body)
    assert (spec.init_timeout_seconds, spec.request_timeout_seconds) == (90.0, 1.5)
    _, spec = to_spec({**body, "init_timeout": None, "obj_timeout": "1d"})
    assert (spec.init_timeout_seconds, spec.request_timeout_seconds) == (300.0, 86400.0)


def test_direct_file_access_reads_the_targets_file() -> None:
    _, spec = to_spec(sdk_body(direct_file_access=True))
    assert spec.arg_type == "fqn" and dict(spec.env) == {"ETL_DIRECT_FQN": "true"}
    _, spec = to_spec({**sdk_body(), "argument": "fqn"})
    assert spec.arg_type == "fqn" and "ETL_DIRECT_FQN" not in dict(spec.env)


def test_sluices_own_body_is_not_aistores() -> None:
    assert not is_ais_message({"name": "x", "spec": {"code": {"source": "y"}}})
    assert not is_ais_message({"name": "x"})  # Sluice's: "ETL spec must be a JSON object"
    assert "beside Sluice's 'spec'" in refusal({"name": "md5-etl", "spec": {}, "runtime": {}})
    assert "unknown field(s) extra" in refusal({"name": "md5-etl", "spec": {}, "extra": 1})


def test_os_packages_are_refused_naming_them() -> None:
    body = sdk_body(os_packages=["ffmpeg"])
    local = refusal(body)
    assert "os_packages (env OS_PACKAGES='ffmpeg')" in local and "sluice up" in local
    assert "FROM Sluice's runtime" in refusal(body, platform="kubernetes")


def test_an_image_becomes_a_foreign_transformer_spec() -> None:
    body = sdk_body(
        "init", image="me/my-etl:1", command="python serve.py", obj_timeout="30s", MODE="x"
    )
    name, spec = to_spec(body)
    assert name == "md5-etl" and spec.foreign and spec.comm_type == "hpush://"
    assert spec.image == "me/my-etl:1" and spec.command == ("python", "serve.py")
    assert dict(spec.env) == {"MODE": "x"} and spec.request_timeout_seconds == 30
    assert spec.code.pickled is spec.code.source is spec.code.ais_class is None
    # what the gateway stores round-trips (the record, the CRD's spec)
    assert EtlSpec.from_dict(spec.to_dict()) == spec
    assert "code" not in spec.to_dict() and spec.to_dict()["commType"] == "hpush://"
    direct = to_spec(sdk_body("init", image="me/my-etl:1", direct_file_access=True))[1]
    assert dict(direct.env) == {"ETL_DIRECT_FQN": "true"} and direct.arg_type == ""


def test_an_image_with_another_protocol_is_refused_clearly() -> None:
    for comm in ("hpull", "ws"):
        why = refusal(sdk_body("init", image="me/my-etl:1", comm_type=comm))
        assert why.startswith("AIStore ETL init message: communication:")
        assert f"'{comm}://' with an ETL image" in why and "hpush://" in why
    body = sdk_body("init", image="me/my-etl:1") | {"argument": "fqn"}
    assert "'fqn' with an ETL image" in refusal(body)


def test_a_foreign_spec_takes_no_sluice_code() -> None:
    base = {"commType": "hpush://", "image": "me/my-etl:1"}
    with pytest.raises(InvalidSpec, match="needs spec.image"):
        EtlSpec.from_dict({"commType": "hpush://"})
    with pytest.raises(InvalidSpec, match=r"spec.code.source does not apply to an AIStore"):
        EtlSpec.from_dict(base | {"code": {"source": "def transform(b): return b"}})
    with pytest.raises(InvalidSpec, match=r"spec.dependencies does not apply"):
        EtlSpec.from_dict(base | {"dependencies": ["x"]})
    with pytest.raises(InvalidSpec, match=r"spec.commType must be one of"):
        EtlSpec.from_dict(base | {"commType": "hpull://"})
    with pytest.raises(InvalidSpec, match=r"spec.command is for an AIStore-style ETL image"):
        EtlSpec.from_dict({"code": {"source": "x"}, "command": ["serve"]})


def test_aistore_1x_messages_are_refused_naming_the_field() -> None:
    pod = base64.b64encode(b"apiVersion: v1\nkind: Pod\n").decode()
    spec_msg = {"name": "md5-etl", "communication": "hpush://", "timeout": "5m", "spec": pod}
    assert refusal(spec_msg).startswith("AIStore ETL init message: spec: this is AIStore 1.x")
    code_msg = {"name": "md5-etl", "communication": "hpush://", "runtime": "python3.11v2"}
    assert "runtime: this is AIStore 1.x's init_code" in refusal({**code_msg, "funcs": {}})
    assert "code: this is AIStore 1.x's init_code" in refusal({**code_msg, "code": "eA=="})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"communication": "io://"}, "communication"),
        ({"init_timeout": "soon"}, "init_timeout"),
        ({"obj_timeout": 45}, "obj_timeout"),
        ({"support_direct_put": "yes"}, "support_direct_put"),
        ({"argument": "path"}, "argument"),
        ({"resources": []}, "resources"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"surprise": 1}, "surprise"),
        ({"env": [{"name": "A", "valueFrom": {}}]}, "env[0].valueFrom"),
        ({"runtime": "python3.11"}, "runtime"),
    ],
)
def test_a_bad_or_unknown_field_is_a_400_naming_it(change: dict[str, Any], field: str) -> None:
    assert f"AIStore ETL init message: {field}" in refusal({**sdk_body(), **change})


def test_class_payload_settings_are_checked() -> None:
    body = sdk_body(NUM_WORKERS="many")
    assert "env NUM_WORKERS: must be a number of workers" in refusal(body)
    body = sdk_body()
    body["runtime"]["image"] = "me/python-with-extras:1"
    assert "must be aistorage/runtime_python:<major.minor>" in refusal(body)
    body = sdk_body()
    body["runtime"]["command"] = ["python", "server.py"]
    assert "runtime.command: is not used with init_class" in refusal(body)
    body = sdk_body()
    body["name"] = "Not_A_Name"
    with pytest.raises(InvalidSpec, match="invalid ETL name"):
        to_spec(body)


class Phases:
    """An ``EtlBackend`` whose record goes through the given phases, one per get."""

    def __init__(self, *phases: str) -> None:
        self.phases = list(phases)
        self.spec = to_spec(sdk_body())[1]

    async def get(self, name: str) -> EtlRecord | None:
        phase = self.phases.pop(0) if len(self.phases) > 1 else self.phases[0]
        return EtlRecord(name=name, uid="u", spec=self.spec, phase=phase, message="why not")


def test_the_init_waits_until_running_or_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aisetl, "POLL_SECONDS", 0.01)
    backend: Any = Phases("Initializing", "Initializing", "Running")
    assert asyncio.run(aisetl.wait_running(backend, "md5-etl", 5)).phase == "Running"
    with pytest.raises(EtlInitFailed, match="ETL 'md5-etl' failed to start: why not"):
        asyncio.run(aisetl.wait_running(Phases("Initializing", "Error"), "md5-etl", 5))  # type: ignore[arg-type]
    with pytest.raises(EtlInitFailed, match="is not running after 1s: phase Initializing"):
        asyncio.run(aisetl.wait_running(Phases("Initializing"), "md5-etl", 1))  # type: ignore[arg-type]
    # a start: the record may still say Stopped until the controller sees the change
    started = Phases("Stopped", "Running")
    assert asyncio.run(aisetl.wait_running(started, "md5-etl", 5)).phase == "Running"  # type: ignore[arg-type]


def test_put_v1_etl_takes_the_message_and_answers_as_aistore(cluster: Cluster) -> None:
    body = {**sdk_body(), "init_timeout": "6s"}  # waits 1 s: this backend never runs it
    r = cluster.client.put("/v1/etl", json=body)
    assert r.status_code == 400 and r.json()["kind"] == "EtlInitFailed"
    assert r.json()["etl"] == "md5-etl" and "not running after 1s" in r.json()["error"]
    shown = cluster.client.get("/v1/etl/md5-etl").json()
    assert shown["spec"]["code"]["aisClass"].startswith("<")  # created, and kept
    r = cluster.client.put("/v1/etl", json=sdk_body(os_packages=["ffmpeg"]))
    assert r.status_code == 400 and "os_packages" in r.json()["error"]
