"""The CRD file itself: parseable, described, and in step with ``EtlSpec``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CRD = Path(__file__).resolve().parents[2] / "crds" / "etls.sluice.dev.yaml"


def schema() -> dict[str, Any]:
    doc = yaml.safe_load(CRD.read_text())
    (version,) = doc["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def walk(node: dict[str, Any], path: str):
    yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{key}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


def test_every_spec_and_status_field_is_described():
    root = schema()
    missing = [
        path
        for path, node in walk(root, "etl")
        if path.startswith(("etl.spec", "etl.status")) and not node.get("description")
    ]
    assert not missing, f"fields without a description (kubectl explain): {missing}"


def test_spec_fields_match_what_etlspec_reads():
    spec = schema()["properties"]["spec"]["properties"]
    assert set(spec) == {
        "mode", "code", "decode", "onError", "dependencies", "workers", "argType", "env",
        "timeouts", "stopped", "cache", "image", "resources", "targetSelector",
        "commType", "command",
    }  # fmt: skip
    assert spec["mode"]["enum"] == ["object", "wds"]
    assert set(spec["code"]["properties"]) == {
        "pickled", "pythonVersion", "source", "entrypoint", "aisClass"
    }  # fmt: skip
