"""Batch jobs across targets: one framework for offline transforms, dSort and more.

A job runs on every member target over the objects that target owns, moves
data between targets when it must, and reports progress. Its state lives on
the targets (``DATA/.jobs/<id>.json``, one part per target), so any gateway
answers for it and a restarted target resumes its part.

The public API (gateway, ``etl_runtime.gateway.jobs``)::

    POST /v1/jobs               {"kind": "...", "spec": {...}} -> {"id": "..."}
    GET  /v1/jobs[?kind=&state=]
    GET  /v1/jobs/{id}          state Running|Finished|Aborted|Failed, reason,
                                progress {objects, bytes, records, skipped},
                                per-target parts, errors (first 100), output
    POST /v1/jobs/{id}/abort

Other gateway routes start jobs with
``etl_runtime.gateway.jobs.start_job(gw, kind, spec)`` (it runs the kind's
``validate`` first, then starts the part on every member; a member away is a
503 naming it).

Writing a kind
--------------

Register it at import time and add the module to ``kinds.KIND_MODULES``::

    from etl_runtime.jobs import JobContext, JobFailed, register_kind

    async def validate(gw, spec: dict) -> dict:     # on the gateway, before start
        ...                                          # raise InvalidRequest / NotFound
        return spec                                  # normalized: every target gets it

    async def run(ctx: JobContext) -> None:          # on every member target
        async def one(name: str) -> None:
            ...                                      # read via ctx.store, transform
            size = await ctx.put_object(dst, out_name, body)  # at the HRW owner + copies
            ctx.progress.add(objects=1, bytes=size, records=n)
        await ctx.map(ctx.owned_objects(src, prefix), one, workers=4)
        await ctx.barrier("sent")                    # every member reached "sent"
        ...                                          # phase 2
        ctx.set_output(bucket=dst)                   # merged across targets

    async def receive(ctx, sender: str, meta: dict, body) -> Any:   # optional
        async for chunk in body: ...                 # what a peer's ctx.send() streams
        return {"ok": True}                          # -> the sender's ctx.send() result

    register_kind("mykind", run, validate=validate, receive=receive, resumable=True)

``JobContext`` (``etl_runtime.jobs.context``):

* ``id``, ``kind``, ``spec``, ``target_id``, ``members`` (sorted target ids),
  ``store``, ``placement``, ``forwarder`` (the target's ``EtlForwarder``),
  ``target`` (``jobs.context.Target``: what a job may use of its target),
  ``workdir`` (a scratch directory,
  removed when the job ends), ``resumed`` (True after a target restart);
* ``progress.add(objects=, bytes=, records=, skipped=)``;
  ``error(obj, message)`` counts and lists a per-object failure (the runner
  decides whether to go on); ``set_output(**kv)`` (numbers are summed across
  targets, lists concatenated);
* ``checkpoint`` (a dict) and ``await save_checkpoint(d)``: persisted at once,
  given back in ``ctx.checkpoint`` when the part resumes after a restart;
  progress, errors and output are persisted every 0.5 s;
* ``check()`` raises ``JobAborted`` once the job was aborted; ``aborted`` is
  the ``asyncio.Event`` (the runner's task is also cancelled on abort);
* ``owned_objects(bucket, prefix)`` — names this target holds and is the
  primary HRW owner of; ``owns(b, o)``, ``owners(b, o)``;
* ``put_object(bucket, name, body)`` — store at the HRW owner (locally, with
  write-through copies, or by a PUT to the owner);
* ``map(items, fn, workers)`` — bounded concurrency with abort;
* ``barrier(name, timeout=None)`` — mark phase ``name`` reached (persisted)
  and wait until every member has; raises ``JobFailed`` if a member failed,
  aborted, or is unreachable longer than the timeout;
* ``send(target, meta, body, timeout=None)`` — stream ``body`` (bytes, an
  async iterable, or a function giving one: then it is retried while the peer
  is away) to ``target``'s ``receive`` (to itself: called directly).

A runner ends the job: returning -> ``Finished`` (once every target has),
raising ``JobFailed(reason)`` or any error -> ``Failed`` with the reason,
abort -> ``Aborted``. When a target stops (or is killed) mid-job, its part
stays ``Running`` on disk and ``run`` is called again (``ctx.resumed``) at its
next start; a kind registered with ``resumable=False`` fails instead. A member
gone longer than ``SLUICE_JOB_TARGET_TIMEOUT`` (default 60 s) fails the job.
"""

from __future__ import annotations

from etl_runtime.jobs.context import JobAborted, JobContext, JobFailed
from etl_runtime.jobs.kinds import Kind, get_kind, load_kinds, register_kind
from etl_runtime.jobs.state import ABORTED, FAILED, FINISHED, RUNNING

__all__ = [
    "ABORTED",
    "FAILED",
    "FINISHED",
    "RUNNING",
    "JobAborted",
    "JobContext",
    "JobFailed",
    "Kind",
    "get_kind",
    "load_kinds",
    "register_kind",
]
