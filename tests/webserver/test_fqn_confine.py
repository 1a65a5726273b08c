"""``etl_fqn`` paths stay under the data roots, also when a batch resolves its directories once.

A batched transform request (``webserver/bulk.py``) checks each object's path
with ``confine(..., dirs)``: the real path of each directory is taken once per
batch. A file or a directory that is a symlink out of the root must still be
refused, and the same path must come out as without the cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from etl_runtime.core.errors import BadRequest
from etl_runtime.webserver.fqn import confine


@pytest.mark.parametrize("cached", [False, True], ids=["alone", "batch"])
def test_paths_under_the_root_and_symlinks_out_of_it(tmp_path: Path, cached: bool) -> None:
    root, outside = tmp_path / "data", tmp_path / "secret"
    (root / "b").mkdir(parents=True)
    outside.mkdir()
    (outside / "key").write_bytes(b"k")
    (root / "b" / "o1").write_bytes(b"1")
    os.symlink(outside / "key", root / "b" / "leak")  # a file that leads out
    os.symlink(outside, root / "out")  # a directory that leads out
    os.symlink(root / "b", root / "alias")  # a directory that stays in
    roots = (os.path.realpath(root),)
    dirs: dict[str, str] | None = {} if cached else None
    for _ in range(2):  # the second time from the batch's resolved directories
        assert confine(str(root / "b" / "o1"), roots, dirs) == os.path.realpath(root / "b" / "o1")
        assert confine(str(root / "alias" / "o1"), roots, dirs) == os.path.realpath(
            root / "b" / "o1"
        )
        sibling = tmp_path / "data2"  # the root's name is a prefix of it: still outside
        sibling.mkdir(exist_ok=True)
        (sibling / "x").write_bytes(b"x")
        outside_paths = (root / "b" / "leak", root / "out" / "key", sibling / "x")
        for bad in (*outside_paths, root / "b" / ".." / ".." / "secret"):
            with pytest.raises(BadRequest, match="outside the target's data directory"):
                confine(str(bad), roots, dirs)
