"""Record keys follow webdataset's rule, and the servers do not pay for webdataset's import."""

from __future__ import annotations

import subprocess
import sys

import pytest
from webdataset.tariterators import base_plus_ext as wds_base_plus_ext

from etl_runtime.dsort.records import base_plus_ext


@pytest.mark.parametrize(
    "name",
    [
        "s001.jpg",
        "s001.seg.png",
        "dir/sub/s001.cls",
        "dir.v2/s001.json",
        "a.b.c.d",
        "noext",
        "dir/noext",
        ".hidden",
        "dir/.hidden.txt",
        "trailing.",
        "",
    ],
)
def test_keys_split_as_webdataset_splits_them(name: str) -> None:
    assert base_plus_ext(name) == wds_base_plus_ext(name)


def test_targets_and_gateways_start_without_importing_torch() -> None:
    """Every target and gateway loads the job kinds at start; importing
    webdataset there (it imports torch) cost each process ~500 MB of RSS."""
    code = (
        "import sys\n"
        "import etl_runtime.storage_target.app, etl_runtime.gateway.app\n"
        "from etl_runtime.jobs import kinds\n"
        "kinds.load_kinds()\n"
        "print(sorted(m for m in ('torch', 'webdataset') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
