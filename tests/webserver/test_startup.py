"""Permanent start-up failures: exit code 2 and one clear last line on stderr."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import httpx

from etl_runtime.core.spec import runtime_python_version
from tests.webserver.conftest import last_line, pickled_code, run_to_exit, source_code, transformer


def upper(data: bytes) -> bytes:
    return data.upper()


def test_python_version_mismatch_exits_2_naming_both_versions() -> None:
    other = f"{sys.version_info.major}.{sys.version_info.minor - 1}"
    proc = run_to_exit("old", {"code": pickled_code(upper, python_version=other)})
    assert proc.returncode == 2
    line = last_line(proc.stderr)
    assert line.startswith("sluice: ETL 'old': ")
    assert f"pickled with Python {other}" in line
    assert f"runs Python {runtime_python_version()}" in line
    assert "source" in line


def test_missing_entrypoint_exits_2() -> None:
    proc = run_to_exit("noep", {"code": source_code("def transform(d):\n    return d\n", "nope")})
    assert proc.returncode == 2
    line = last_line(proc.stderr)
    assert line.startswith("sluice: ETL 'noep': ")
    assert "no 'nope'" in line and "transform" in line


def test_entrypoint_not_callable_exits_2() -> None:
    proc = run_to_exit("notfn", {"code": source_code("transform = 42\n")})
    assert proc.returncode == 2
    assert "not a callable" in last_line(proc.stderr)


def test_source_that_raises_exits_2() -> None:
    proc = run_to_exit("boom", {"code": source_code("raise ImportError('no cv2 here')\n")})
    assert proc.returncode == 2
    assert "ImportError: no cv2 here" in last_line(proc.stderr)


def test_dependency_install_failure_exits_2(tmp_path: Path) -> None:
    bogus = str(tmp_path / "no-such-package-dir")
    spec = {"code": source_code("def transform(d):\n    return d\n"), "dependencies": [bogus]}
    proc = run_to_exit("deps", spec)
    assert proc.returncode == 2
    line = last_line(proc.stderr)
    assert line.startswith("sluice: ETL 'deps': pip could not install dependencies")
    assert "no-such-package-dir" in line


def test_invalid_spec_exits_2() -> None:
    proc = run_to_exit("bad", {"mode": "video", "code": source_code("")})
    assert proc.returncode == 2
    assert "spec.mode" in last_line(proc.stderr)


def _wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel, so pip installs it without any network."""
    path = directory / "sluicedep-0.1-py3-none-any.whl"
    files = {
        "sluicedep/__init__.py": "MARK = b'dep-ok'\n",
        "sluicedep-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: sluicedep\n"
        "Version: 0.1\n",
        "sluicedep-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "sluicedep-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("sluicedep-0.1.dist-info/RECORD", record)
    return path


def test_dependencies_are_importable_in_workers(tmp_path: Path) -> None:
    source = "import sluicedep\n\ndef transform(d):\n    return sluicedep.MARK\n"
    spec = {"code": source_code(source), "dependencies": [str(_wheel(tmp_path))]}
    deps = str(tmp_path / "deps")
    with transformer("deps-ok", spec, workers=1, SLUICE_DEPS_DIR=deps) as url:
        assert httpx.put(f"{url}/b/o", content=b"x").content == b"dep-ok"
    assert (tmp_path / "deps" / "sluicedep" / "__init__.py").exists()
