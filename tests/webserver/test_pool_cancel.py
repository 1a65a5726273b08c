"""``Task.next_frame`` never swallows a cancellation (Python 3.11 ``wait_for`` did).

On 3.11, ``asyncio.wait_for`` returns the inner result when the outer task is
cancelled in the same loop iteration as the inner await completes. A response
stream cancelled because its client went away would then keep pulling frames
from the worker instead of stopping.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from etl_runtime.webserver import ipc
from etl_runtime.webserver.pool import OBJECT_TASK, Task


def _task() -> Task:
    pool: Any = SimpleNamespace(request_timeout=30.0)
    worker: Any = SimpleNamespace(pid=0, kill=lambda: None)
    return Task(pool, worker, OBJECT_TASK)


def test_cancel_as_frame_arrives_is_not_swallowed() -> None:
    async def main() -> None:
        task = _task()
        reader = asyncio.create_task(task.next_frame())
        for _ in range(5):
            await asyncio.sleep(0)  # reader is now waiting for a frame
        task.channel.put_final((ipc.CHUNK, b"x"))  # the frame arrives...
        reader.cancel()  # ...and the client goes away, in the same iteration
        with pytest.raises(asyncio.CancelledError):
            await reader
        # the frame was not consumed by the cancelled reader
        assert list(task.channel.items) == [(ipc.CHUNK, b"x")]

    asyncio.run(main())


def test_timeout_still_reported() -> None:
    from etl_runtime.core.errors import TransformTimeout

    async def main() -> None:
        killed: list[bool] = []
        pool: Any = SimpleNamespace(request_timeout=0.05)
        worker: Any = SimpleNamespace(pid=0, kill=lambda: killed.append(True))
        task = Task(pool, worker, OBJECT_TASK)
        with pytest.raises(TransformTimeout):
            await task.next_frame()
        assert killed == [True]

    asyncio.run(main())
