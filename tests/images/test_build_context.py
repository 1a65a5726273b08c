"""The images' build steps work on this repository, run here without Docker.

The ``app`` stage builds the sluice wheel from the ``.dockerignore``-filtered
context, and the ``deps`` stage turns ``pyproject.toml`` into a requirements
file with an inline Python snippet. Both run here on a copy of the context;
the wheel must carry every console script the images use as ENTRYPOINT.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tests.images.dockerfile import IMAGES, all_images

REPO = IMAGES.parent


def dockerignore_filter(root: Path) -> list[Path]:
    """Files of ``root`` that survive ``.dockerignore`` (last matching rule wins)."""
    rules = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            rules.append((negate, line.lstrip("!").rstrip("/")))
    kept = []
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        included = True
        for negate, pattern in rules:
            parts = rel.split("/")
            prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            if pattern.startswith("**/"):
                hit = any(fnmatch.fnmatch(p, pattern[3:]) for p in parts)
            else:
                hit = any(fnmatch.fnmatch(p, pattern) for p in prefixes)
            if hit:
                included = negate
        if included:
            kept.append(path)
    return kept


def test_context_is_small_and_holds_only_sources() -> None:
    files = [p.relative_to(REPO).as_posix() for p in dockerignore_filter(REPO)]
    assert "pyproject.toml" in files
    assert any(f.startswith("etl_runtime/") for f in files)
    assert any(f.startswith("operator/etl_operator/") for f in files)
    for f in files:
        assert not f.startswith((".venv/", ".git/", "tests/", "helm/", "demo-out/")), f
        assert "__pycache__" not in f and not f.endswith(".pyc"), f


def test_app_stage_builds_a_wheel_with_every_entrypoint(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for path in dockerignore_filter(REPO):
        dest = context / path.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    # As the Dockerfile's `pip wheel --no-deps .`, without fetching a build backend.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "dist"), "."],
        cwd=context, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "dist").glob("sluice-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (ep_name,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = zf.read(ep_name).decode()
    assert any(n.startswith("etl_runtime/webserver/") for n in names)
    assert any(n.startswith("etl_operator/") for n in names)
    for name, image in all_images().items():
        entry = image.final.exec_form("ENTRYPOINT")
        assert entry is not None
        assert re.search(rf"^{re.escape(entry[0])}\s*=", entry_points, re.M), (
            f"{name}: the wheel has no console script {entry[0]}"
        )


def _names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement lines (``name[extra]>=1; marker``), normalized."""
    out = set()
    for line in requirements:
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            name = re.split(r"[\[<>=!~;@ ]", line, maxsplit=1)[0]
            out.add(re.sub(r"[-_.]+", "-", name).lower())
    return out


def test_deps_stage_installs_the_locked_dependencies() -> None:
    """Every image builds its dependencies' wheels from ``images/locked/server.txt`` (the
    lock's versions, exported by ``make lock``; ``make lint`` checks it against uv.lock),
    and that file pins every dependency the servers declare; the runtime adds the
    aistore SDK's (``ais.txt``)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    locked = {
        f: _names((REPO / "images" / "locked" / f).read_text().splitlines())
        for f in ("server.txt", "ais.txt")
    }
    assert _names(pyproject["project"]["dependencies"] + extras["server"]) <= locked["server.txt"]
    assert _names(extras["ais"]) <= locked["ais.txt"] | locked["server.txt"]
    for name, image in all_images().items():
        deps = next(s for s in image.stages if s.name == "deps")
        copies = [v for k, v in deps.instructions if k == "COPY"]
        runs = [v for k, v in deps.instructions if k == "RUN"]
        assert "images/locked/server.txt requirements.txt" in copies, name
        assert any("pip wheel" in r and "-r requirements.txt" in r for r in runs), name
        if name == "runtime":  # and the aistore SDK, for AIStore ETL classes (init_class)
            assert "images/locked/ais.txt extra.txt" in copies, name
            assert any("-r extra.txt" in r for r in runs), name
        # The first step is the same in every image, so a layer-caching builder shares it.
        assert runs[0] == next(
            v for k, v in all_images()["server"].stages[0].instructions if k == "RUN"
        ), name
