"""``sluice job ls|show|wait|abort`` and ``sluice transform``: batch jobs from the shell.

Registered by ``etl_runtime.cli.commands.build_parser`` (``register(sub)``). ``wait``
(and ``transform --wait``) shows a tqdm progress bar on stderr and exits 1,
with the reason, if the job failed or was aborted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

from tqdm import tqdm

from etl_runtime.sdk import Client, Job

RAW = argparse.RawDescriptionHelpFormatter


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _progress(p: dict[str, Any]) -> str:
    mib = p.get("bytes", 0) / (1 << 20)
    text = f"{p.get('objects', 0)} objects, {mib:.1f} MiB"
    if p.get("records"):
        text += f", {p['records']} records"
    if p.get("skipped"):
        text += f", {p['skipped']} skipped"
    return text


def format_job(j: dict[str, Any]) -> str:
    lines = [
        f"job {j['id']} ({j['kind']}): {j['state']}"
        + (f" - {j['reason']}" if j.get("reason") else ""),
        f"  started {_when(j.get('started'))}, ended {_when(j.get('ended'))}",
        f"  progress: {_progress(j['progress'])}, {j.get('error_count', 0)} errors",
    ]
    if j.get("output"):
        lines.append(f"  output: {json.dumps(j['output'])}")
    for t, part in sorted((j.get("targets") or {}).items()):
        extra = f" - {part['reason']}" if part.get("reason") else ""
        progress = _progress(part["progress"]) if "progress" in part else ""
        lines.append(f"  {t}: {part['state']} {progress}{extra}")
    for e in j.get("errors") or []:
        lines.append(f"  error: {e.get('target')}: {e.get('object')}: {e.get('error')}")
    return "\n".join(lines)


def wait_with_bar(job: Job, timeout: float | None) -> dict[str, Any]:
    """``job.wait`` with a progress bar (objects; the total when the job knows it)."""
    bar = tqdm(desc=job.id, unit="obj", file=sys.stderr, dynamic_ncols=True)

    def update(status: dict[str, Any]) -> None:
        p = status["progress"]
        done = p.get("objects", 0) + p.get("skipped", 0)
        total = (status.get("output") or {}).get("total")
        if isinstance(total, int) and total > 0:
            bar.total = total
        bar.n = done
        bar.set_postfix_str(
            f"{p.get('bytes', 0) / (1 << 20):.1f} MiB, {status.get('error_count', 0)} errors"
        )
        bar.refresh()

    try:
        return job.wait(timeout, on_progress=update)
    finally:
        bar.close()


def cmd_job(client: Client, args: argparse.Namespace) -> None:
    if args.action == "ls":
        jobs = client.jobs(kind=args.kind, state=args.state)
        for j in jobs:
            print(
                f"{j['id']:<24} {j['kind']:<10} {j['state']:<9} {_when(j['started'])}  "
                f"{_progress(j['progress'])}, {j['error_count']} errors"
            )
        return
    if not args.id:
        what = "a job kind" if args.action == "start" else "a job id"
        raise SystemExit(f"sluice: error: 'sluice job {args.action}' needs {what}")
    if args.action == "start":
        spec: dict[str, Any] = {}
        if args.bucket:
            spec["bucket"] = args.bucket
        if args.mbps is not None:
            spec["mbps"] = args.mbps
        started = client.request_json("POST", "/v1/jobs", json_body={"kind": args.id, "spec": spec})
        job = client.job(str(started["id"]))
        print(job.id if args.wait is None else format_job(wait_with_bar(job, args.wait)))
        return
    job = client.job(args.id)
    if args.action == "show":
        status = job.status()
        print(json.dumps(status, indent=1) if args.json else format_job(status))
    elif args.action == "abort":
        print(format_job(job.abort()))
    else:
        print(format_job(wait_with_bar(job, args.wait)))


def cmd_transform(client: Client, args: argparse.Namespace) -> None:
    ext = {}
    for item in args.ext:
        old, sep, new = item.partition(":")
        if not (old and sep and new):
            raise SystemExit(f"sluice: error: --ext takes OLD:NEW (e.g. jpg:npy), got {item!r}")
        ext[old] = new
    job = client.bucket(args.src).transform(
        args.etl.split(","),
        to_bucket=args.dst,
        prefix=args.prefix,
        template=args.template,
        prepend=args.prepend,
        ext=ext,
        skip_existing=args.skip_existing,
        dry_run=args.dry_run,
        num_workers=args.num_workers,
        continue_on_error=not args.stop_on_error,
        etl_args=args.etl_args,
    )
    if not args.wait:
        print(job.id)
        return
    print(format_job(wait_with_bar(job, None)))


def register(sub: Any) -> None:
    j = sub.add_parser(
        "job",
        help="list, show, wait for or abort batch jobs (transforms, dSort)",
        formatter_class=RAW,
        epilog="examples:\n"
        "  sluice job ls --state Running\n"
        "  sluice job show etl-bck-1a2b3c4d\n"
        "  sluice job wait etl-bck-1a2b3c4d --wait 600\n"
        "  sluice job abort etl-bck-1a2b3c4d\n"
        "  sluice job start scrub --bucket images --wait 600",
    )
    j.add_argument("action", choices=["ls", "show", "wait", "abort", "start"])
    j.add_argument("id", nargs="?", help="job id (show, wait, abort); start: the kind (scrub)")
    j.add_argument("--bucket", help="start scrub: only this bucket (default: every bucket)")
    j.add_argument("--mbps", type=float, help="start scrub: MiB/s read per target (default 64)")
    j.add_argument("--kind", help="ls: only jobs of this kind (etl-bck, dsort, ...)")
    j.add_argument("--state", choices=["Running", "Finished", "Aborted", "Failed"])
    j.add_argument("--json", action="store_true", help="show: the raw JSON")
    j.add_argument("--wait", type=float, metavar="SECONDS", help="wait: give up after this")
    j.set_defaults(func=cmd_job)

    t = sub.add_parser(
        "transform",
        help="transform bucket SRC into bucket DST through an ETL (or a pipeline) offline",
        formatter_class=RAW,
        epilog="examples:\n"
        "  sluice transform images images-npy --etl to-npy --ext jpg:npy --wait\n"
        "  sluice transform shards shards-aug --etl decode,augment --template "
        "'shard-{000..099}.tar'\n"
        "  sluice transform raw clean --etl fix --skip-existing   # only what changed\n"
        "prints the job id (follow it with `sluice job wait ID`), or with --wait the result",
    )
    t.add_argument("src", metavar="SRC")
    t.add_argument("dst", metavar="DST")
    t.add_argument("--etl", required=True, metavar="A[,B,...]", help="ETL, or a pipeline a,b,c")
    t.add_argument("--etl-args", metavar="ARGS", help="string passed to every transform")
    t.add_argument("--prefix", default="", help="only objects under this prefix")
    t.add_argument("--template", default="", help="only these names: 'shard-{000..099}.tar'")
    t.add_argument("--prepend", default="", help="prefix for the output names")
    t.add_argument(
        "--ext", action="append", default=[], metavar="OLD:NEW", help="rename extensions"
    )
    t.add_argument("--skip-existing", action="store_true", help="skip outputs newer than inputs")
    t.add_argument("--dry-run", action="store_true", help="count, write nothing")
    t.add_argument("--num-workers", type=int, default=0, help="objects in flight per target")
    t.add_argument("--stop-on-error", action="store_true", help="fail at the first bad object")
    t.add_argument("--wait", action="store_true", help="wait, with a progress bar")
    t.set_defaults(func=cmd_transform)
