"""One WebDataset sample through decode → user function → encode, in a worker.

Decoding and encoding are the ``webdataset`` library's own: ``spec.decode`` is
an image spec of ``webdataset.autodecode.ImageHandler`` ("pil", "rgb",
"torchrgb", "l8", ...) used in an ``autodecode.Decoder`` exactly as
``WebDataset(...).decode(spec)`` builds it; without ``decode`` the function
sees the raw bytes, as ``WebDataset(url)`` without ``.decode`` would. Results
are encoded with ``webdataset.writer.encode_based_on_extension`` and its
default handlers (what ``TarWriter`` uses).

``tar_members`` lays the encoded sample out as ``TarWriter.write`` does (one
``<key>.<ext>`` member per field, sorted, metadata fields dropped), but as
bytes built here in the worker, so the server only forwards them. A result
whose member names would be unsafe to extract (absolute, or with a ``..``
segment: ``targuard.unsafe_name``) is refused as ``BadResult``, as unsafe input
names are refused before they reach the function.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import tarfile
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from etl_runtime.core.errors import (
    BadResult,
    CodeLoadError,
    DecodeError,
    TransformError,
    traceback_tail,
)
from etl_runtime.wire.formats.targuard import unsafe_name


def _codec_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """webdataset's ``autodecode`` and ``writer``, without the package's ``__init__``.

    That ``__init__`` imports webdataset's datasets and, for their base classes,
    torch (``webdataset.pytorch``): about 4 s of CPU (CUDA torch's libraries) in
    every transformer that decodes and encodes samples but never builds a
    dataset, 30-60 s of wall time to a ready wds transformer on a loaded
    machine. These two modules import only numpy, braceexpand and webdataset's
    ``utils`` and ``gopen`` (torch only inside its torch handlers), so they are
    loaded from webdataset's folder as a private package. ``import webdataset``
    in user code still gets the whole library, torch included; a webdataset
    already imported is used as it is.
    """
    if "webdataset" in sys.modules:
        from webdataset import autodecode, writer

        return autodecode, writer
    found = importlib.util.find_spec("webdataset")
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'webdataset'", name="webdataset")
    name = f"{__name__}_webdataset"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = list(found.submodule_search_locations)
        package.__package__ = name
        sys.modules[name] = package
    return importlib.import_module(f"{name}.autodecode"), importlib.import_module(f"{name}.writer")


if TYPE_CHECKING:
    from webdataset import autodecode, writer
else:
    autodecode, writer = _codec_modules()

IMAGE_SPECS = tuple(autodecode.imagespecs)


def make_decoder(decode: str | None) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """The library decoder for ``spec.decode``, or None for raw bytes."""
    if decode is None:
        return None
    if decode not in IMAGE_SPECS:
        raise CodeLoadError(
            f"spec.decode {decode!r} is not a webdataset image spec; use one of "
            f"{', '.join(IMAGE_SPECS)} or leave it unset for raw bytes"
        )
    return autodecode.Decoder([autodecode.ImageHandler(decode)])


class SampleTransform:
    """Decode, call the user function, encode: the per-sample work of wds mode."""

    def __init__(self, fn: Callable[..., Any], with_args: bool, decode: str | None) -> None:
        self.fn = fn
        self.with_args = with_args
        self.decode = decode
        self.decoder = make_decoder(decode)
        self.handlers = writer.default_handlers

    def __call__(self, sample: dict[str, Any], args: str | None) -> bytes:
        """Tar bytes of the transformed sample (``b""`` when the function drops it)."""
        key = str(sample.get("__key__"))
        if self.decoder is not None:
            try:
                sample = self.decoder(sample)
            except autodecode.DecodingError as e:
                cause = e.__cause__ or e
                raise DecodeError(
                    f"sample {key!r}: field {e.k!r} does not decode as "
                    f"{self.decode!r}: {type(cause).__name__}: {cause}",
                    sample=key,
                    detail=traceback_tail(cause),
                ) from e
        try:
            out = self.fn(sample, args) if self.with_args else self.fn(sample)
        except Exception as e:
            raise TransformError(
                f"sample {key!r}: transform raised {type(e).__name__}: {e}",
                sample=key,
                detail=traceback_tail(e),
            ) from e
        if out is None:
            return b""
        if not isinstance(out, dict):
            raise BadResult(
                f"sample {key!r}: transform returned {type(out).__name__}; "
                "return a dict of fields (with '__key__') or None to drop the sample",
                sample=key,
            )
        out.setdefault("__key__", key)
        try:
            encoded = writer.encode_based_on_extension(out, self.handlers)
        except Exception as e:
            raise BadResult(
                f"sample {key!r}: cannot encode result: {type(e).__name__}: {e} "
                "(fields are encoded by extension, as webdataset's TarWriter does)",
                sample=key,
                detail=traceback_tail(e),
            ) from e
        return tar_members(encoded)


def tar_members(sample: dict[str, Any]) -> bytes:
    """Tar members for an encoded sample, laid out as ``webdataset.TarWriter.write``."""
    key = sample["__key__"]
    if why := unsafe_name(str(key)):
        raise BadResult(
            f"sample {str(key)[:300]!r}: the result's __key__ would make member names "
            f"with {why}; return a relative key without '..'",
            sample=str(key)[:300],
        )
    now = time.time()
    parts: list[bytes] = []
    for k in sorted(sample):
        if k[0] == "_":
            continue
        v = sample[k]
        if isinstance(v, str):
            v = v.encode("utf-8")
        if not isinstance(v, bytes | bytearray | memoryview):
            raise BadResult(
                f"sample {key!r}: field {k!r} is {type(v).__name__} after encoding, not bytes",
                sample=str(key),
            )
        ti = tarfile.TarInfo(f"{key}.{k}")
        ti.size = len(v)
        ti.mtime = int(now)
        ti.mode = 0o444
        ti.uname = ti.gname = "bigdata"
        parts.append(ti.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
        parts.append(bytes(v))
        pad = -len(v) % tarfile.BLOCKSIZE
        if pad:
            parts.append(tarfile.NUL * pad)
    return b"".join(parts)
