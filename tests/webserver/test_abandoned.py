"""Abandoned work does not hold workers (issue 20 #8).

A request whose client left used to keep its worker until the transform
finished or ``requestSeconds`` (600 s) ran out, so a hung ETL blocked every
later request for minutes. Now a client that disconnects before the first
byte gets its worker killed and replaced at once, and the default
``requestSeconds`` is 120 s. (Worker processes, ``SLUICE_INLINE=0``; the
inline default frees its thread: test_default_shape.)
"""

from __future__ import annotations

import time

import httpx
import pytest

from etl_runtime.core.spec import EtlSpec
from tests.webserver.conftest import source_code, transformer

HANGS = (
    "import time\n\n"
    "def transform(data):\n"
    "    if data == b'hang':\n"
    "        time.sleep(3600)\n"
    "    return data.upper()\n"
)


@pytest.mark.parametrize("how", ["body", "fqn"])
def test_a_client_that_leaves_frees_its_worker(how: str, loop_name: str, tmp_path) -> None:
    spec = {"mode": "object", "code": source_code(HANGS)}
    hang = tmp_path / "hang.bin"
    hang.write_bytes(b"hang")
    with (
        transformer("hangs", spec, workers=1, SLUICE_LOOP=loop_name, SLUICE_INLINE="0") as url,
        httpx.Client(timeout=60) as c,
    ):
        assert c.put(f"{url}/b/ok", content=b"ok").content == b"OK"
        with pytest.raises(httpx.ReadTimeout):  # the client gives up after 1 s
            if how == "body":
                c.put(f"{url}/b/hang", content=b"hang", timeout=1.0)
            else:
                c.put(f"{url}/b/hang", params={"etl_fqn": str(hang)}, timeout=1.0)
        started = time.monotonic()
        r = c.put(f"{url}/b/ok", content=b"again")  # the only worker was stuck
        assert r.status_code == 200 and r.content == b"AGAIN", r.text
        assert time.monotonic() - started < 15, "the abandoned transform held the worker"
        logs = c.get(f"{url}/logs", params={"tail": 50}).text
        assert "client left before worker" in logs


def test_the_default_request_limit_is_two_minutes() -> None:
    spec = EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d\n"}})
    assert spec.request_timeout_seconds == 120.0
