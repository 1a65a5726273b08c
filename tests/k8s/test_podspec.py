"""Pod spec resolution that needs no cluster: ``$(VAR)`` expansion and commands."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.k8s.podspec import LaunchError, expand, field_value, launch


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--host $(POD_IP)", "--host 127.0.1.7"),
        ("$(A)$(B)", "1two"),
        ("$$(POD_IP)", "$(POD_IP)"),  # escaped
        ("$(MISSING) stays", "$(MISSING) stays"),
        ("$(unclosed", "$(unclosed"),
        ("cost $5", "cost $5"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    env = {"POD_IP": "127.0.1.7", "A": "1", "B": "two"}
    assert expand(text, env) == expected


def test_field_refs() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"app": "a"}},
        "spec": {"nodeName": "node-0"},
        "status": {"podIP": "127.0.1.3"},
    }
    assert field_value(pod, "status.podIP") == "127.0.1.3"
    assert field_value(pod, "metadata.labels['app']") == "a"
    with pytest.raises(LaunchError):
        field_value(pod, "spec.bogus")


def test_commands_resolve_from_the_project_venv() -> None:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    run = launch({"name": "c", "command": ["python"], "args": ["-V"]}, env, {}, False)
    assert run.argv == [str(Path(sys.executable).parent / "python"), "-V"]
    with pytest.raises(LaunchError, match="no command"):
        launch({"name": "c", "image": "nginx"}, env, {}, False)


def test_mounts_use_a_private_mount_namespace_or_env_fallback(tmp_path: Path) -> None:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    spec = {
        "name": "c",
        "command": ["python"],
        "workingDir": "/data",
        "volumeMounts": [{"name": "v", "mountPath": "/data", "readOnly": True}],
    }
    run = launch(spec, dict(env), {"/data": tmp_path}, use_unshare=True)
    assert run.argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = run.argv[6]
    assert f"mount --bind {tmp_path} /data" in script
    assert "mount -o remount,bind,ro /data" in script
    assert script.endswith('cd /data && exec "$@"')
    # Without mount namespaces (not root): the directory is handed over in the env.
    fallback = launch(spec, dict(env), {"/data": tmp_path}, use_unshare=False)
    assert fallback.env["SLUICE_VOLUME_DATA"] == str(tmp_path)
    assert fallback.argv[0].endswith("/python")


def test_a_volume_over_the_checkout_does_not_hide_the_project(tmp_path: Path) -> None:
    """An emptyDir at a parent of the checkout (e.g. /tmp while CI clones into
    /tmp/...) must not hide the venv and code the pod runs from."""
    import subprocess

    from tests.k8s.podspec import IMAGE_ROOTS, can_unshare

    assert can_unshare(), "the process kubelet needs root + unshare --mount here"
    checkout = IMAGE_ROOTS[0]
    parent = str(Path(checkout).parent)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    spec = {
        "name": "c",
        "command": ["python"],
        "args": ["-c", "import etl_runtime, sys; print(etl_runtime.__file__)"],
        "volumeMounts": [{"name": "v", "mountPath": parent}],
    }
    run = launch(spec, dict(env), {parent: tmp_path}, use_unshare=True)
    out = subprocess.run(run.argv, env=run.env, cwd=run.cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(checkout)
