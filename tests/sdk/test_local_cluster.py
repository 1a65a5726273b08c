"""The SDK against a real local cluster: ``Etl.start()`` returns once the ETL serves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from etl_runtime import Client
from tests.e2e.local import running_cluster


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory) -> Iterator[str]:
    with running_cluster(tmp_path_factory.mktemp("cluster"), targets=2) as url:
        yield url


def test_start_waits_until_running_so_a_get_right_after_works(endpoint: str) -> None:
    # retries=0: the GET must succeed because start() waited, not because it retried.
    with Client(endpoint, retries=0) as client:
        obj = client.bucket("sdk-start").create().object("a.txt")
        obj.put_content(b"hello")
        etl = client.etl("sdk-start")
        etl.init_code(transform=lambda data: data.upper())
        assert etl.stop().phase == "Stopped"

        details = etl.start()
        assert details.phase == "Running" and details.ready == details.total == 2
        assert obj.get_bytes(etl_name="sdk-start") == b"HELLO"
        etl.delete()
