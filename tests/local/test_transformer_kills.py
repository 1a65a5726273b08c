"""Readers of an ETL while its transformers are killed with -9 (issue 20 #4b).

A target answers an ETL GET with a 307 straight to its transformer, so a
transformer that dies showed clients raw transport errors: 288 ``ConnectError``
and 35 ``RemoteProtocolError`` in the audit, because the record kept saying
"ready" until the controller's next pass. Now the controller acts on the exit
at once (targets answer 503 + ``Retry-After`` naming the ETL and target while
it restarts), and the SDK takes a failed hop to a transformer back to the
target that sent it there. What a reader of the SDK sees: the right bytes, or
at worst a 503 once its retries are spent; never a transport error.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil

from etl_runtime import Client
from etl_runtime.local import LocalCluster
from etl_runtime.sdk import errors
from tests.local.test_up import UPPER, wait_running

OBJECTS = 12
KILLS = 3


def payload(i: int) -> bytes:
    return f"object {i} ".encode() * (100 + 40 * i)


def leaders(up_pid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(up_pid).children(recursive=True):
        try:
            if "etl_runtime.webserver" in p.cmdline() and os.getsid(p.pid) == p.pid:
                out.append(p)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    return out


def test_killed_transformers_show_sdk_readers_only_data_or_503(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "data", targets=3) as cluster:
        c = httpx.Client(base_url=cluster.endpoint, follow_redirects=True, timeout=60)
        assert c.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
        for i in range(OBJECTS):
            assert c.put(f"/v1/objects/bkt/o{i}", content=payload(i)).status_code == 200
        assert c.put("/v1/etl", json={"name": "upper", "spec": UPPER}).status_code == 200
        wait_running(c, "upper")

        answers: list[tuple[int, str | None, str]] = []  # every HTTP answer the SDK got
        outcomes: list[tuple[float, str, str]] = []  # (when, outcome, detail)
        stop = threading.Event()
        sdk = Client(cluster.endpoint)
        sdk._http.event_hooks["response"] = [
            lambda r: answers.append((r.status_code, r.headers.get("retry-after"), str(r.url)))
        ]

        def read_loop() -> None:
            n = 0
            while not stop.is_set():
                i = n % OBJECTS
                n += 1
                try:
                    data = sdk.bucket("bkt").object(f"o{i}").get_bytes(etl_name="upper")
                except errors.Unavailable as e:  # its retries spent: allowed, with the cause
                    outcomes.append((time.monotonic(), "503", str(e)))
                    continue
                except errors.SluiceError as e:  # anything else: a failure of this test
                    outcomes.append((time.monotonic(), type(e).__name__, str(e)))
                    continue
                good = data == payload(i).upper()
                outcomes.append((time.monotonic(), "ok" if good else "wrong", f"o{i}"))

        reader = threading.Thread(target=read_loop, name="sdk-reader")
        reader.start()
        try:
            for kill in range(KILLS):
                victims = leaders(cluster.pid)
                assert len(victims) == 3, cluster.output[-3000:]
                killed_at = time.monotonic()
                for p in victims:
                    p.send_signal(signal.SIGKILL)
                deadline = killed_at + 120

                def back(killed_at: float = killed_at) -> bool:  # replaced, read since the kill
                    if not any(t > killed_at + 0.5 and o == "ok" for t, o, _ in outcomes[-50:]):
                        return False
                    details = c.get("/v1/etl/upper").json()
                    return details.get("phase") == "Running" and len(leaders(cluster.pid)) == 3

                while not back():
                    assert time.monotonic() < deadline, f"not serving again after kill {kill + 1}"
                    assert reader.is_alive()
                    time.sleep(0.2)
                time.sleep(1.0)  # some reads of the replacements before the next kill
        finally:
            stop.set()
            reader.join(120)
            sdk.close()
        c.close()

    kinds = sorted({o for _, o, _ in outcomes})
    bad = [(o, d) for _, o, d in outcomes if o not in ("ok", "503")]
    assert not bad, f"outcomes {kinds}; not data nor 503: {bad[:5]}"
    assert sum(o == "ok" for _, o, _ in outcomes) >= KILLS
    odd = [a for a in answers if a[0] not in (200, 307) and not (a[0] == 503 and a[1])]
    assert not odd, f"answers other than 200, 307 and 503 + Retry-After: {odd[:5]}"
    unavailable = [a for a in answers if a[0] == 503]
    assert unavailable, "no 503 while the transformers restarted: did the kills land?"
