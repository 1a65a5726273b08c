"""What a transformer's answer breaking off mid-stream means to the target relaying it.

A wds answer breaks after its first byte when the user's function fails on a
sample (the transformer sends an error marker, ``wire/formats/tarbreak.py``, then aborts),
when a worker dies, or when the transformer is killed. The target relaying it
adds its own marker where needed and raises ``TransformerStreamBroken`` so the
client's connection is aborted. In a pipeline that stream is the next step's
request body: if it breaks before that step answered, the answer is still to
come, and ``upstream_error`` makes it the broken step's failure.
"""

from __future__ import annotations

from etl_runtime.core.errors import EtlNotReady, SluiceError, WorkerDied, from_wire


class TransformerStreamBroken(Exception):
    """The transformer's answer broke off after we started relaying it.

    ``marked``: the error marker the transformer sent first, if one went by
    (``TarCursor.marked``: sample, message, kind). Raised into the next step of a
    pipeline before that step answered, it becomes that answer (``upstream_error``).
    """

    def __init__(
        self, message: str, etl: str, marked: tuple[str, str, str | None] | None = None
    ) -> None:
        super().__init__(message)
        self.etl, self.marked = etl, marked


def upstream_error(e: BaseException, target: str, bucket: str, name: str) -> SluiceError | None:
    """The answer for a pipeline step whose body source, the step before, broke off
    before this step answered: that ETL's failure, not this one's.

    The transformer's marker says what failed: a deterministic failure of the
    user's function (``TransformError``, ``BadResult``, ...) keeps its 4xx; a
    worker that died, or a stream broken without a marker (a transformer killed),
    is a 503 naming the ETL that broke, as a retry may pass.
    """
    while e is not None and not isinstance(e, TransformerStreamBroken):
        e = e.__cause__  # type: ignore[assignment]
    if e is None:
        return None
    context = {"etl": e.etl, "bucket": bucket, "object": name}
    if e.marked is not None:
        sample, message, kind = e.marked
        err = from_wire({"kind": kind, "message": message, "sample": sample})
        if 400 <= err.status < 500 or isinstance(err, WorkerDied):
            err.context.update(context, sample=sample)
            return err
    return EtlNotReady(
        f"the transformer of ETL {e.etl!r} on target {target!r} broke off its answer "
        f"({e}); retry shortly",
        etl=e.etl,
        bucket=bucket,
        object=name,
    )
