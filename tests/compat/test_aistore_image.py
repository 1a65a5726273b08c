"""An AIStore user's own ETL image (a server speaking AIStore's hpush protocol, built
here from ``tests/images/hpush_echo/``) runs as a Sluice ETL by image: the official
``aistore`` SDK's ``init(image=...)`` against a real ``sluice up``, which runs it
under podman, one container per target (``etl_runtime/local/containers.py``)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from etl_runtime import Client as SluiceClient
from etl_runtime.cluster.reconcile import EXIT_CONFIG_ERROR
from etl_runtime.cluster.records import EtlRecord, TargetInfo
from etl_runtime.core.errors import InvalidSpec
from etl_runtime.core.spec import EtlSpec
from etl_runtime.local import LocalCluster
from etl_runtime.local.containers import ETL_LABEL, PODMAN_ENV, check, spawn
from tests.images.build import ImageUnavailable, image

aistore = pytest.importorskip("aistore")
from aistore.sdk import Client  # noqa: E402
from aistore.sdk.errors import AISError  # noqa: E402
from aistore.sdk.etl import ETLConfig  # noqa: E402

BIG = bytes(range(97, 123)) * (5 * 2**20 // 26 + 1)  # > 4 MiB: streamed to the image


@pytest.fixture(scope="module")
def echo_image() -> str:
    try:
        return image("hpush_echo")
    except ImageUnavailable as e:
        pytest.skip(f"cannot build the test ETL image: {e}")


@pytest.fixture(scope="module")
def cluster(echo_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("aisimage") / "data", targets=2) as c:
        bck = Client(c.endpoint).bucket("src")
        bck.create(exist_ok=True)
        for name, body in (("a.txt", b"hello"), ("dir/b c.txt", b"world"), ("fail.txt", b"x")):
            bck.object(name).get_writer().put_content(body)
        bck.object("big.bin").get_writer().put_content(BIG)
        yield c.endpoint


def containers(etl: str) -> list[dict]:
    out = subprocess.run(
        ["podman", "ps", "--all", "--format", "json", "--filter", f"label={ETL_LABEL}={etl}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return json.loads(out or "[]")


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not so after {timeout:g}s: {what}")
        time.sleep(0.25)


def test_an_image_runs_as_an_etl_and_stop_and_delete_remove_its_containers(
    cluster: str, echo_image: str
) -> None:
    ais = Client(cluster)
    etl = ais.etl("echo-img")
    etl.init(image=echo_image, comm_type="hpush", init_timeout="3m", obj_timeout="60s")
    running = containers("echo-img")
    assert len(running) == 2 and all(c["State"] == "running" for c in running)
    assert {c["Image"] for c in running} == {echo_image}
    bck = ais.bucket("src")
    assert bck.object("a.txt").get_reader(etl=ETLConfig("echo-img")).read_all() == b"HELLO"
    got = bck.object("dir/b c.txt").get_reader(etl=ETLConfig("echo-img", args="md5")).read_all()
    assert got == hashlib.md5(b"world").hexdigest().encode()
    big = bck.object("big.bin").get_reader(etl=ETLConfig("echo-img")).read_all()
    assert len(big) == len(BIG) and big == BIG.upper()
    # what the image answers as an error is a Sluice error, never data
    r = requests.get(f"{cluster}/v1/objects/src/fail.txt", params={"etl_name": "echo-img"})
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["etl"] == "echo-img" and err["object"] == "fail.txt"
    assert (
        f"ETL 'echo-img' (image {echo_image!r}) failed to transform 'src/fail.txt'"
        in (err["error"])
    )
    assert "its server answered 500: cannot transform /src/fail.txt" in err["error"]
    # AIStore's view and Sluice's own SDK both show it for what it is
    view = etl.view()
    assert view.init_msg.runtime.image == echo_image
    details = SluiceClient(cluster).etl("echo-img").details()
    assert details.spec["commType"] == "hpush://" and details.spec["image"] == echo_image

    # an offline (bucket-to-bucket) transform through the image, with the SDK's job API
    job_id = bck.transform("echo-img", to_bck=ais.bucket("dst"), prefix_filter="dir/")
    assert ais.job(job_id).wait(timeout=120, verbose=False).success
    assert ais.bucket("dst").object("dir/b c.txt").get_reader().read_all() == b"WORLD"

    etl.stop()
    wait_for("echo-img's containers removed on stop", lambda: not containers("echo-img"))
    etl.start()
    assert len(containers("echo-img")) == 2
    assert bck.object("a.txt").get_reader(etl=ETLConfig("echo-img")).read_all() == b"HELLO"
    etl.delete()
    wait_for("echo-img's containers removed on delete", lambda: not containers("echo-img"))


def test_sluices_own_sdk_runs_an_image_with_its_command_and_env(
    cluster: str, echo_image: str
) -> None:
    etl = SluiceClient(cluster).etl("echo-cmd")
    etl.init_image(echo_image, command=["python3", "/app/server.py"], env={"MODE": "x"})
    (first, *_) = containers("echo-cmd")
    inspect = subprocess.run(
        ["podman", "inspect", first["Id"]], capture_output=True, text=True, timeout=60, check=True
    )
    config = json.loads(inspect.stdout)[0]["Config"]
    assert "MODE=x" in config["Env"] and "DIRECT_PUT=false" in config["Env"]
    assert any(e.startswith("AIS_TARGET_URL=http://127.0.0.1:") for e in config["Env"])
    r = requests.get(f"{cluster}/v1/objects/src/a.txt", params={"etl_name": "echo-cmd"})
    assert r.status_code == 200 and r.content == b"HELLO"
    # a later step of a pipeline: the image gets the previous ETL's output
    rev = SluiceClient(cluster).etl("rev")
    rev.init_spec("def transform(data):\n    return data[::-1]\n")
    for big in (False, True):
        r = requests.get(
            f"{cluster}/v1/objects/src/{'big.bin' if big else 'a.txt'}",
            params={"etl_name": "rev", "etl_pipeline": "echo-cmd"},
        )
        assert r.status_code == 200, r.text
        assert r.content == (BIG[::-1].upper() if big else b"OLLEH")
    rev.delete()
    etl.delete()
    wait_for("echo-cmd's containers removed", lambda: not containers("echo-cmd"))


def test_an_image_that_never_passes_its_health_probe_is_a_clear_error(
    cluster: str, echo_image: str
) -> None:
    ais = Client(cluster)
    started = time.monotonic()
    with pytest.raises(AISError) as e:
        ais.etl("sick-img").init(image=echo_image, init_timeout="20s", FAIL_HEALTH="1")
    assert time.monotonic() - started < 60  # the gateway answers before init_timeout
    assert e.value.status_code == 400
    assert "ETL 'sick-img' is not running after" in e.value.message
    assert "/health answered 503" in e.value.message
    ais.etl("sick-img").delete()
    wait_for("sick-img's containers removed", lambda: not containers("sick-img"))


def test_without_podman_an_image_is_refused_naming_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = EtlSpec.from_dict({"commType": "hpush://", "image": "me/etl:1"})
    monkeypatch.setenv(PODMAN_ENV, "off")
    with pytest.raises(InvalidSpec) as e:
        check("my-etl", spec)
    assert e.value.status == 400 and e.value.context["etl"] == "my-etl"
    assert "ETL 'my-etl' is the container image 'me/etl:1'" in e.value.message
    assert "runs such images with podman, and SLUICE_PODMAN=off" in e.value.message
    monkeypatch.setenv(PODMAN_ENV, str(tmp_path / "no-podman-here"))
    with pytest.raises(InvalidSpec, match="there is no '.*no-podman-here' on this machine"):
        check("my-etl", spec)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(PODMAN_ENV)
    with pytest.raises(InvalidSpec, match="podman is not installed on this machine"):
        check("my-etl", spec)


def test_sluice_up_without_podman_refuses_an_image_at_init(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(PODMAN_ENV, "off")  # sluice up passes it on to its gateway
    with LocalCluster(tmp_path / "data", targets=1) as c:
        with pytest.raises(AISError) as e:
            Client(c.endpoint).etl("no-podman").init(image="me/etl:1")
        assert e.value.status_code == 400
        assert "ETL 'no-podman' is the container image 'me/etl:1'" in e.value.message
        assert "runs such images with podman, and SLUICE_PODMAN=off" in e.value.message
        assert "no-podman" not in [e.name for e in SluiceClient(c.endpoint).list_etls()]


def test_sluice_up_leaves_no_container_behind_when_it_stops(
    echo_image: str, tmp_path: Path
) -> None:
    with LocalCluster(tmp_path / "data", targets=1) as c:
        Client(c.endpoint).etl("left-img").init(image=echo_image, init_timeout="3m")
        assert [x["State"] for x in containers("left-img")] == ["running"]
    wait_for("left-img's container removed at shutdown", lambda: not containers("left-img"))


def test_an_image_that_is_not_there_is_a_clear_error(cluster: str) -> None:
    ais = Client(cluster)
    with pytest.raises(AISError) as e:
        # generous: under load podman takes its time to fail; the error ends the wait early
        ais.etl("absent-img").init(image="localhost/sluice-test/absent:1", init_timeout="90s")
    assert e.value.status_code == 400
    # either the wait ran out, or the restarts did (phase Error): both name the cause
    assert (
        "ETL 'absent-img' is not running after" in e.value.message
        or "ETL 'absent-img' failed to start" in e.value.message
    ), e.value.message
    # podman's own error, from the transformer's log (a localhost/ ref: no traffic leaves)
    assert "exited with code 125: Error: " in e.value.message
    assert "localhost/sluice-test/absent:1" in e.value.message
    ais.etl("absent-img").delete()
    wait_for("absent-img's containers gone", lambda: not containers("absent-img"))


def test_podman_gone_since_init_is_a_config_error_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = EtlSpec.from_dict({"commType": "hpush://", "image": "me/etl:1"})
    rec = EtlRecord(name="gone", uid="u", spec=spec)
    monkeypatch.setenv(PODMAN_ENV, "off")

    async def scenario() -> None:
        p = await spawn(rec, TargetInfo("t0", "http://127.0.0.1:1"), "gone-t0", 0, tmp_path)
        await asyncio.wait_for(p.exited(), 60)
        assert p.poll() and p.exit_code == EXIT_CONFIG_ERROR  # phase Error, not restarted
        assert p.message is not None and "SLUICE_PODMAN=off" in p.message

    asyncio.run(scenario())
