"""``SLUICE_LOOP`` reaches the servers ``sluice up`` starts (it filters ``SLUICE_*``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from etl_runtime.local import LocalCluster


def _gateway_has_uvloop(data: Path) -> bool:
    # This cluster's gateway only: other test processes may run gateways of their own.
    pids = subprocess.run(
        ["pgrep", "-f", f"etl_runtime.gateway .*{data}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    maps = []
    for pid in pids:
        try:
            maps.append(Path(f"/proc/{pid}/maps").read_text())
        except OSError:
            continue
    assert maps, "no gateway process found"
    return all("uvloop" in m for m in maps)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_chosen_loop_runs_the_gateway(
    loop: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.setenv("SLUICE_LOOP", loop)
    monkeypatch.setenv("SLUICE_ZYGOTE", "off")
    with LocalCluster(tmp_path / "data", targets=1):
        assert _gateway_has_uvloop(tmp_path / "data") is (loop == "uvloop")
