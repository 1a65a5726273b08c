"""The AIStore-compatibility table of docs/aistore.md is this module's ``CALLS``.

Each row is (SDK call, status, the test module that drives it, the word that
module must contain). A row marked ``works`` must name a test module that
exists and calls it; a refused row says why. The table in the docs is
compared with ``CALLS`` cell by cell, so neither can change without the other.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "aistore.md"
HEADING = "## SDK calls, one by one"
WORKS = "works"

# (call, status, test module under tests/, a word the module contains)
CALLS: list[tuple[str, str, str, str]] = [
    (
        "`bucket.create()`, `bucket.delete()`, `cluster().list_buckets()`",
        WORKS,
        "compat/test_aistore_multiobj.py",
        "list_buckets",
    ),
    (
        "`bucket.list_objects()`, `list_objects_iter()`, `list_all_objects()`",
        WORKS,
        "compat/test_aistore_sdk.py",
        "list_objects_iter",
    ),
    (
        "listing flags `NO_RECURSION`, `NAME_ONLY`, `NAME_SIZE` (`CACHED`, `BCK_PRESENT`, "
        "`DONT_HEAD_REMOTE`, `DONT_ADD_REMOTE`, `NO_DIRS`: no change)",
        WORKS,
        "compat/test_aistore_listing.py",
        "NO_RECURSION",
    ),
    (
        "listing flag `ARCH_DIR`, `bucket.list_archive(shard)`: the files inside `.tar`, "
        "`.tgz`/`.tar.gz` and `.zip` shards (`shard.tar/member`, sizes, AIStore's archive flags)",
        WORKS,
        "compat/test_aistore_listing.py",
        "list_archive",
    ),
    (
        "`get_reader(archive_config=ArchiveConfig(archpath=...))`, `ArchiveConfig(regex, mode)` "
        "(`regexp`, `prefix`, `suffix`, `substr`, `wdskey`: a tar of the matches), also with "
        "`direct=True`",
        WORKS,
        "compat/test_aistore_listing.py",
        "ArchiveMode.WDSKEY",
    ),
    (
        "listing flags `MISSING`, `DELETED`, `NOT_CACHED`, `ONLY_REMOTE_PROPS`, `DIFF`, `IS_S3`, "
        "`NBI`",
        "refused: a 400 naming the flag (not listed by Sluice yet)",
        "compat/test_aistore_listing.py",
        "DIFF",
    ),
    (
        "`obj.get_writer().put_content()`, `put_file()`",
        WORKS,
        "compat/test_aistore_sdk.py",
        "put_file",
    ),
    (
        "`obj.get_reader().read_all()`, with `ETLConfig(name, args)`",
        WORKS,
        "compat/test_aistore_etl.py",
        "ETLConfig",
    ),
    (
        "`obj.copy(to_obj)`, `obj.copy(to_obj, etl=ETLConfig(...))`",
        WORKS,
        "compat/test_aistore_copy.py",
        "copy",
    ),
    (
        "`bucket.copy(to_bck, prefix_filter, prepend, dry_run)` (`copy-bck`)",
        WORKS,
        "compat/test_aistore_copy.py",
        "prefix_filter",
    ),
    (
        "`bucket.transform(to_bck, etl_name)` (`etl-bck`)",
        WORKS,
        "compat/test_aistore_jobs.py",
        "transform",
    ),
    ("`bucket.summary()`, `bucket.info()`", WORKS, "compat/test_aistore_buckets.py", "info"),
    (
        "`objects(...).delete()` (`delete-listrange`)",
        WORKS,
        "compat/test_aistore_multiobj.py",
        "delete",
    ),
    (
        "`objects(...).evict()` (`evict-listrange`, an `aws` bucket; an `ais` bucket is a 400)",
        WORKS,
        "compat/test_aistore_multiobj.py",
        "evict-listrange",
    ),
    (
        "`objects(...).copy(to_bck, prepend)` (`copy-listrange`)",
        WORKS,
        "compat/test_aistore_copy.py",
        "copy-listrange",
    ),
    (
        "`objects(...).transform(to_bck, etl_name, ext)`, `objects(...).inspect(etl_name)` "
        "(`etl-listrange`)",
        WORKS,
        "compat/test_aistore_copy.py",
        "inspect",
    ),
    (
        "`Job.wait()`, `status()`, `get_details()`, `abort()`, `cluster().list_jobs_status()`, "
        "`list_running_jobs()`",
        WORKS,
        "compat/test_aistore_jobs.py",
        "list_running_jobs",
    ),
    (
        "a job whose objects fail: `Job.wait()` unsuccessful with `N object(s) failed: obj: why` "
        "(with `continue_on_error`), failed at the first error without it",
        WORKS,
        "compat/test_aistore_copy.py",
        "object(s) failed",
    ),
    (
        "`dsort().start(spec)` (`missing_shards` by default `ignore`, shards cut by AIStore's "
        "size rule)",
        WORKS,
        "compat/test_aistore_jobs.py",
        "dsort",
    ),
    (
        "on the Kubernetes chart: `objects(...).copy()`, `objects(...).transform()` and "
        "`dsort().start()`, each followed by `Job.wait()`",
        WORKS,
        "helm/test_realstack.py",
        "AisClient",
    ),
    ("`client.batch(...)` (GetBatch)", WORKS, "batch/test_getbatch.py", "batch"),
    (
        '`job(job_kind="get-batch").wait()`, `list_running_jobs(job_kind="get-batch")` (always '
        "idle: a GetBatch is served within its request)",
        WORKS,
        "compat/test_aistore_props.py",
        "get-batch",
    ),
    (
        "`etl.init_class()`, `etl.init(image=...)`, `view()`, `stop()`, `start()`",
        WORKS,
        "compat/test_aistore_etl.py",
        "init_class",
    ),
    (
        "`init_class(obj_timeout=...)`: an object past it fails once (422 `TransformTimeout` "
        "naming ETL, object and timeout; not retried by the SDK), one failed object of an "
        "offline transform",
        WORKS,
        "compat/test_aistore_etl.py",
        'obj_timeout="2s"',
    ),
    ("`etl.init_spec()`", "refused on purpose: a whole pod spec; use `init(image=...)`", "", ""),
    ("dSort `content` / external key maps", "refused on purpose: a 400 naming the field", "", ""),
    (
        "`os_packages` of an ETL run locally",
        "refused on purpose: packages are not installed on the host",
        "",
        "",
    ),
    (
        "`objects(...).prefetch(continue_on_error, num_workers)` (`prefetch-listrange`, a remote "
        "bucket; an `ais` bucket is a 400: not a remote bucket)",
        WORKS,
        "compat/test_aistore_prefetch.py",
        "prefetch(",
    ),
    (
        "`objects(...).archive(archive_name, mime, to_bck, include_source_name, allow_append, "
        "continue_on_err)` (`archive`: tar, tgz, zip)",
        WORKS,
        "compat/test_aistore_archive.py",
        "allow_append",
    ),
    (
        "`bucket.rename(to_bck_name)` (`move-bck`, a job; an existing name is a 409)",
        WORKS,
        "compat/test_aistore_rename.py",
        "rename",
    ),
    (
        "`obj.multipart_upload()`: `create()`, `add_part(n)`, `complete()`, `abort()`",
        WORKS,
        "compat/test_aistore_multipart.py",
        "multipart_upload",
    ),
    (
        "`multipart_upload()` and `append_content()` / `as_file()` over HTTPS "
        "(`Client(ca_cert=...)`, `sluice up --tls`)",
        WORKS,
        "tls/test_tls.py",
        "multipart_upload",
    ),
    (
        '`get_writer().append_content(handle, flush)`, `as_file(mode="a"|"w")`, `flush()`',
        WORKS,
        "compat/test_aistore_multipart.py",
        "append_content",
    ),
    (
        "`obj.get_writer().set_custom_props(md, replace_existing)` (`PATCH`)",
        WORKS,
        "compat/test_aistore_props.py",
        "set_custom_props",
    ),
    (
        "`obj.head(props=...)`: the props asked only (`ais-version`, `ais-custom-md`, "
        "`ais-checksum-*`, `ais-atime`, ...)",
        WORKS,
        "compat/test_aistore_props.py",
        "obj_version",
    ),
    ("`cluster().get_info()` (`Smap`, its `uuid`)", WORKS, "compat/test_aistore_props.py", "uuid"),
    ("`etl.logs()`, `etl.logs(target_id)`", WORKS, "compat/test_aistore_copy.py", "logs"),
    (
        "`etl.view(job_id)` of an offline transform: `obj_errors` of that job",
        WORKS,
        "compat/test_aistore_copy.py",
        "obj_errors",
    ),
]


def table_rows() -> list[tuple[str, str, str]]:
    text = DOC.read_text()
    assert HEADING in text, f"{DOC} has no {HEADING!r} section"
    lines = text.split(HEADING, 1)[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start:end]  # the first table after the heading
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in rows[2:]]
    return [(c[0].replace("\\|", "|"), c[1], c[2]) for c in cells]


def rendered() -> list[tuple[str, str, str]]:
    return [(call, status, f"`tests/{mod}`" if mod else "") for call, status, mod, _ in CALLS]


def test_the_docs_table_is_calls() -> None:
    assert table_rows() == rendered(), "\n" + "\n".join(
        f"| {c} | {s} | {t} |" for c, s, t in rendered()
    )


def test_every_call_that_works_is_driven_by_its_test_module() -> None:
    for call, status, module, word in CALLS:
        if status == WORKS:
            path = ROOT / "tests" / module
            assert path.is_file(), (call, module)
            assert word in path.read_text(), (call, module, word)
        else:
            assert status.startswith("refused"), (call, status)
