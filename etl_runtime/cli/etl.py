"""``sluice etl ...``: register, inspect, stop, start and delete ETLs from the command line.

``load_code`` reads ``--code FILE.py:FUNCTION`` (checking the function is
defined at top level before anything is sent); ``format_details`` prints
``sluice etl show``. Registered by ``etl_runtime.cli.commands.build_parser``.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import sys
from pathlib import Path
from typing import Any

from etl_runtime.cli.errors import CliError
from etl_runtime.sdk import Client, EtlDetails


def load_code(ref: str) -> tuple[str, str]:
    """``FILE.py:FUNC`` -> (source, FUNC), checking FUNC is defined at top level."""
    path, sep, func = ref.rpartition(":")
    if not (sep and path and func):
        raise CliError(f"--code expects FILE.py:FUNCTION, got {ref!r}")
    try:
        source = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise CliError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    if func not in _top_level_names(tree):
        raise CliError(f"{path} defines no top-level {func!r}")
    return source, func


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def cmd_etl(client: Client, args: argparse.Namespace) -> None:
    if args.action == "ls":
        etls = client.list_etls()
        print(f"{'NAME':<24} {'PHASE':<13} {'MODE':<7} READY")
        for e in etls:
            print(f"{e.name:<24} {e.phase:<13} {e.mode:<7} {e.ready}/{e.total}")
        return
    if not args.name:
        raise CliError(f"'sluice etl {args.action}' needs an ETL name")
    etl = client.etl(args.name)
    if args.action == "init":
        if not args.code:
            raise CliError("'sluice etl init' needs --code FILE.py:FUNCTION")
        source, entrypoint = load_code(args.code)
        env = dict(_split_env(e) for e in args.env)
        print(f"ETL {args.name!r}: initializing...", file=sys.stderr)
        details = etl.init_spec(
            source=source,
            entrypoint=entrypoint,
            mode=args.mode,
            decode=args.decode,
            on_error=args.on_error,
            dependencies=args.dep,
            workers=args.workers,
            timeout=args.timeout,
            env=env,
            arg_type=args.arg_type,
            cache=args.cache,
        )
        print(f"ETL {args.name!r} {details.phase} ({details.ready}/{details.total} ready)")
    elif args.action == "show":
        print(format_details(etl.details()))
    elif args.action in ("stop", "start"):
        details = etl.stop() if args.action == "stop" else etl.start()
        print(f"ETL {args.name!r} {details.phase}")
    elif args.action == "rm":
        etl.delete()
        print(f"ETL {args.name!r} deleted")
    elif args.action == "logs":
        for target, text in sorted(etl.logs(tail=args.tail).items()):
            print(f"==> {target} <==")
            print(text.rstrip("\n"))


def _split_env(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not (key and sep):
        raise CliError(f"--env expects KEY=VALUE, got {item!r}")
    return key, value


def format_details(d: EtlDetails) -> str:
    lines = [
        f"name:     {d.name}",
        f"phase:    {d.phase}" + (f" ({d.message})" if d.message else ""),
        f"mode:     {d.mode or '-'}",
        f"ready:    {d.ready}/{d.total}",
        "transformers:",
    ]
    for t in d.transformers:
        health = "ready" if t.get("ready") else "not ready"
        note = f"  {t['message']}" if t.get("message") else ""
        lines.append(f"  {t.get('target')}: {t.get('endpoint') or '-'}  {health}{note}")
    if not d.transformers:
        lines.append("  (none)")
    s = d.stats
    lines.append(
        f"counts:   objects {s.get('objects', 0)}, samples {s.get('samples', 0)}, "
        f"skipped {s.get('skipped', 0)}, errors {s.get('errors', 0)}"
    )
    if d.spec.get("cache"):
        lines.append(
            f"cache:    hits {s.get('cache_hits', 0)}, misses {s.get('cache_misses', 0)}, "
            f"bytes {s.get('cache_bytes', 0)}, evictions {s.get('cache_evictions', 0)}"
        )
    lines.append("last errors:" + ("" if d.last_errors else " (none)"))
    for e in d.last_errors:
        where = e.get("object") or "-"
        if e.get("sample"):
            where += f" sample {e['sample']}"
        when = _when(e.get("time"))
        lines.append(f"  {when} {e.get('target') or '-'} {where}: {e.get('error')}")
    return "\n".join(lines)


def _when(value: Any) -> str:
    """Error times come as epoch seconds or ISO text; show both as UTC ISO."""
    if isinstance(value, int | float):
        stamp = datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
        return stamp.isoformat(timespec="seconds").replace("+00:00", "Z")
    return str(value or "-")
