"""FileRegistry: the record files targets read on every transformed request."""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from etl_runtime.cluster.local import registry as registry_mod
from etl_runtime.cluster.local.registry import FileRegistry
from etl_runtime.cluster.records import EtlRecord, TransformerStatus
from etl_runtime.core.errors import RegistryUnreadable
from etl_runtime.core.spec import CodeSpec, EtlSpec, InvalidSpec


def record(name: str = "upper", phase: str = "Running", port: int = 9000) -> EtlRecord:
    spec = EtlSpec(code=CodeSpec(source="def transform(b):\n    return b.upper()\n"))
    ts = TransformerStatus(target="t0", endpoint=f"http://127.0.0.1:{port}", ready=True)
    return EtlRecord(name=name, uid="u1", spec=spec, phase=phase, transformers=(ts,))


def test_write_then_get_roundtrips_and_is_private(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path / "etl")
    rec = record()
    reg.write(rec)
    assert reg.get("upper") == rec
    assert FileRegistry(tmp_path / "etl").get("upper") == rec  # another process's view
    mode = stat.S_IMODE(os.stat(tmp_path / "etl" / "upper.json").st_mode)
    assert mode == 0o600  # the spec may carry env secrets
    assert [p.name for p in (tmp_path / "etl").iterdir()] == ["upper.json"]  # no temp left


def test_missing_and_hostile_names_are_none(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path)
    (tmp_path.parent / "evil.json").write_text("{}")
    assert reg.get("nope") is None
    assert reg.get("../evil") is None
    assert reg.get("") is None


def test_the_state_files_beside_the_records_are_no_etls(tmp_path: Path, caplog) -> None:
    """``sluice up`` keeps the S3 keys and the ETLs' uids in the records' directory:
    neither is listed (nor warned about) as an ETL, and no ETL may take their names."""
    reg = FileRegistry(tmp_path)
    reg.write(record())
    (tmp_path / "s3-keys.json").write_text('{"keys": []}')
    (tmp_path / "etl-uids.json").write_text('{"upper": 70001}')
    with caplog.at_level("WARNING"):
        assert [r.name for r in reg.list()] == ["upper"]
    assert caplog.records == []
    assert reg.get("s3-keys") is None
    with pytest.raises(InvalidSpec, match="reserved"):
        reg.write(record(name="s3-keys"))
    assert (tmp_path / "s3-keys.json").read_text() == '{"keys": []}'


def test_unchanged_file_is_served_from_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(registry_mod, "RACY_SECONDS", 0.0)
    reg = FileRegistry(tmp_path)
    reg.write(record())
    first = reg.get("upper")
    assert reg.get("upper") is first
    reg.write(record(phase="Error"))
    again = reg.get("upper")
    assert again is not None and again.phase == "Error"


def test_rapid_same_size_rewrite_is_seen(tmp_path: Path) -> None:
    # Same size, probably same mtime tick, maybe a reused inode: still re-read.
    reg = FileRegistry(tmp_path)
    reader = FileRegistry(tmp_path)
    for port in range(9000, 9050):
        reg.write(record(port=port))
        got = reader.get("upper")
        assert got is not None and got.transformers[0].endpoint == f"http://127.0.0.1:{port}"


def test_delete_and_list(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path)
    for name in ("b", "a", "c"):
        reg.write(record(name))
    (tmp_path / "junk.json").write_text("not json")
    assert [r.name for r in reg.list()] == ["a", "b", "c"]
    reg.delete("b")
    assert reg.get("b") is None
    assert [r.name for r in reg.list()] == ["a", "c"]
    with pytest.raises(KeyError):
        reg.delete("b")


def test_readers_never_see_a_torn_file(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path)
    reg.write(record())
    stop = threading.Event()
    bad: list[object] = []

    def read() -> None:
        reader = FileRegistry(tmp_path)
        while not stop.is_set():
            got = reader.get("upper")
            if got is None or got.name != "upper":
                bad.append(got)

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    base = record()
    for i in range(200):
        reg.write(dataclasses.replace(base, message="x" * (i % 7)))
    stop.set()
    for t in threads:
        t.join()
    assert bad == []


def test_a_torn_record_is_an_error_naming_the_etl_not_a_missing_one(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path)
    (tmp_path / "half.json").write_text('{"name": "half", "spec": {')
    with pytest.raises(RegistryUnreadable) as e:
        reg.get("half")
    assert e.value.status == 503 and "Retry-After" not in e.value.headers
    assert "'half'" in e.value.message and "half.json" in e.value.message
    reg.write(record())  # a good version, then a torn one: the last good one is served
    good = reg.get("upper")
    (tmp_path / "upper.json").write_text("{")
    assert reg.get("upper") == good
    assert [r.name for r in reg.list()] == ["upper"]  # the torn "half" is left out, logged


def test_a_record_another_uid_cannot_read_is_an_error_naming_it(tmp_path: Path) -> None:
    """The case of a target running as another user than the writer (mode 0600 files):
    read as ``nobody`` in a forked child (root reads any file), which has every module
    it needs imported already."""
    if os.getuid() != 0:
        pytest.fail("this test needs root to change uid, as the CI machine has")
    shared = Path(tempfile.mkdtemp(prefix="sluice-registry-"))
    try:
        shared.chmod(0o755)
        FileRegistry(shared).write(record())  # mode 0600, owned by root
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                try:
                    FileRegistry(shared).get("upper")
                    out = "no error"
                except RegistryUnreadable as e:
                    out = f"{e.status} {e.message}"
                os.write(w, out.encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            out = f.read().decode()
        os.waitpid(pid, 0)
        assert out.startswith("503 "), out
        assert "'upper'" in out and "Permission denied" in out and "uid 65534" in out
    finally:
        shutil.rmtree(shared)
