"""A target that stops mid-dSort stops its part: the stop is never lost.

dSort sends and publishes in ``JobContext.map``. When a target stops, it
cancels the job's task and waits for it; the part resumes at the next start.
A lost cancel left the stopping target's part running to the end: its
``publish`` unlinked output shards while the restarted target, resuming from
the checkpoint it had read, found them gone ("output shard ... is incomplete").

The cancel was lost when it landed just as ``map`` queued an item (Python
3.11's ``asyncio.wait_for`` then returns the result instead of raising).
Here the cancel lands at every step of that hand-off, one run each.
"""

from __future__ import annotations

import asyncio

from etl_runtime.jobs.context import JobContext


def _ctx() -> JobContext:
    ctx = JobContext.__new__(JobContext)  # map() needs only the abort flag
    ctx.aborted = asyncio.Event()
    return ctx


async def _cancel_after(steps: int) -> str:
    """Cancel a ``map`` whose producer waits on a full queue, ``steps`` loop turns after
    a worker frees a slot. What the cancelled ``map`` did: "cancelled", "finished"."""
    gate = asyncio.Event()
    done: list[int] = []

    async def fn(item: int) -> None:
        await gate.wait()
        done.append(item)

    task = asyncio.create_task(_ctx().map(range(8), fn, workers=1))
    for _ in range(10):  # the worker holds item 0; 1, 2 queued; the producer waits on 3
        await asyncio.sleep(0)
    assert not task.done() and not done
    gate.set()  # the worker finishes 0 and takes 1: a slot frees, item 3 goes in
    for _ in range(steps):
        await asyncio.sleep(0)
    if not task.cancel():
        return "ended before the cancel"
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=5)
    except asyncio.CancelledError:
        return "cancelled"
    return f"finished all {len(done)} items after the cancel"


def test_a_stop_during_map_always_cancels_it() -> None:
    outcomes = [asyncio.run(_cancel_after(steps)) for steps in range(12)]
    assert set(outcomes) <= {"cancelled", "ended before the cancel"}, outcomes
    assert "cancelled" in outcomes
