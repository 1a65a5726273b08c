"""The servers' lock files are theirs alone: any user may flock a file it can open, and
one that held the cluster map's lock would stop every map update (a bucket made, a
token made or revoked). Under ``sluice up`` an ETL's code runs as another uid
(``local/runas.py``); ``test_probes.py`` has it try, as root. These check the modes
themselves, as any user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from etl_runtime.cluster.clustermap import FileClusterMap
from etl_runtime.local import sandbox


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_cluster_maps_lock_is_made_0600(tmp_path: Path) -> None:
    cmap = FileClusterMap(tmp_path / "cluster.json")
    cmap.update(lambda m: m)
    assert mode(tmp_path / "cluster.json.lock") == 0o600


def test_lock_down_closes_lock_files_made_before(tmp_path: Path) -> None:
    for name in sandbox.LOCKS:
        (tmp_path / name).touch(mode=0o644)
        os.chmod(tmp_path / name, 0o644)  # as an older sluice up (or a umask of 022) left it
    sandbox.lock_down(tmp_path, os.getgid())
    assert {name: mode(tmp_path / name) for name in sandbox.LOCKS} == dict.fromkeys(
        sandbox.LOCKS, 0o600
    )
    assert mode(tmp_path) == 0o711
