"""Where a remote bucket's endpoint, region and keys come from (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl_runtime.core.errors import InvalidRequest
from etl_runtime.providers.aws import resolve
from etl_runtime.providers.props import check_backend_props


def write_profiles(home: Path) -> None:
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n"
        "[lab]\naws_access_key_id = LAB\naws_secret_access_key = labsecret\n"
    )
    (home / ".aws" / "config").write_text(
        "[profile lab]\nregion = eu-west-3\nendpoint_url = http://lab-s3:9000\n"
    )


def test_bucket_props_win_over_the_environment_which_wins_over_profiles(tmp_path: Path) -> None:
    write_profiles(tmp_path)
    env = {
        "HOME": str(tmp_path),
        "AWS_ENDPOINT_URL": "http://env-s3:9000",
        "AWS_REGION": "us-west-2",
        "AWS_ACCESS_KEY_ID": "ENV",
        "AWS_SECRET_ACCESS_KEY": "envsecret",
    }
    s = resolve("b", {}, env)
    assert (s.endpoint, s.region, s.access_key_id) == ("http://env-s3:9000", "us-west-2", "ENV")
    s = resolve("b", {"endpoint": "http://prop:1", "region": "ap-south-1"}, env)
    assert (s.endpoint, s.region, s.access_key_id) == ("http://prop:1", "ap-south-1", "ENV")
    # Without keys in the environment: the profile (AWS_PROFILE, else default).
    s = resolve("b", {}, {"HOME": str(tmp_path)})
    assert (s.access_key_id, s.secret_access_key, s.endpoint) == ("DEF", "defsecret", None)
    s = resolve("b", {}, {"HOME": str(tmp_path), "AWS_PROFILE": "lab"})
    assert (s.access_key_id, s.region, s.endpoint) == ("LAB", "eu-west-3", "http://lab-s3:9000")
    # A bucket's secret "profile:lab" wins over the environment's keys.
    s = resolve("b", {"secret": "profile:lab"}, env)
    assert s.access_key_id == "LAB" and s.credentials_from == "profile 'lab'"


def test_mounted_secrets_and_anonymous(tmp_path: Path) -> None:
    secret = tmp_path / "keys"
    secret.mkdir()
    (secret / "AWS_ACCESS_KEY_ID").write_text("MOUNTED\n")
    (secret / "AWS_SECRET_ACCESS_KEY").write_text("mountedsecret\n")
    env = {"SLUICE_SECRETS_DIR": str(tmp_path), "AWS_ACCESS_KEY_ID": "ENV"}
    s = resolve("b", {"secret": "keys"}, env)
    assert (s.access_key_id, s.secret_access_key) == ("MOUNTED", "mountedsecret")
    assert resolve("b", {"secret": "anonymous"}, env).anonymous
    with pytest.raises(InvalidRequest, match="secret 'nope' of bucket aws://b is not mounted"):
        resolve("b", {"secret": "nope"}, env)


def test_bad_props_are_refused_by_name() -> None:
    assert check_backend_props("b", {"validate_warm_get": True}, {"region": "x"}) == {
        "region": "x",
        "validate_warm_get": True,
    }
    assert check_backend_props("b", {"region": None}, {"region": "x"}) == {}
    with pytest.raises(InvalidRequest, match="endpoint of bucket 'b' must be an http"):
        check_backend_props("b", {"endpoint": "minio:9000"}, {})
    with pytest.raises(InvalidRequest, match="validate_interval"):
        check_backend_props("b", {"validate_interval": -1}, {})
    with pytest.raises(InvalidRequest, match="validate_warm_get"):
        check_backend_props("b", {"validate_warm_get": "yes"}, {})


def test_one_list_of_providers_and_nothing_outside_the_seam_names_one() -> None:
    """Every provider of core/providers.py is a module with a BACKEND whose props
    are its own; no other module of the servers, CLI or SDK spells a provider's name."""
    import ast
    import importlib

    from etl_runtime.core import providers

    for p in providers.PROVIDERS:
        module = importlib.import_module(p.module)
        assert module.BACKEND.provider == p.name
        assert set(p.props) <= set(providers.BACKEND_KEYS)
        assert providers.canonical(p.name) == p.name
        assert all(providers.canonical(a) == p.name for a in p.aliases)
    assert providers.split_uri("gs://b/o") == ("gcp", "b/o")
    assert providers.split_uri("az://b") == ("azure", "b")
    assert providers.split_uri("b/o") == ("ais", "b/o")
    root = Path(__file__).resolve().parents[2] / "etl_runtime"
    seam = (root / "providers", root / "core" / "providers.py")
    found = [
        f"{path.relative_to(root)}:{node.lineno}: {node.value!r}"
        for path in sorted(root.rglob("*.py"))
        if not any(path == s or s in path.parents for s in seam)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in providers.names()
    ]
    assert found == [], "\n".join(found)
