"""AIStore ETL classes (``spec.code.aisClass``) run in Sluice's own runtime.

The official aistore SDK's ``Etl.init_class()`` sends a cloudpickled subclass of
its ``ETLServer`` (``FastAPIServer``, ``FlaskServer``,
``HTTPMultiThreadedServer``); the gateway turns that message into a spec
(``gateway/aisetl.py``). Sluice does not start the class's own HTTP server:
its transformer is the server, and each worker process (``spec.workers``,
from ``NUM_WORKERS``) unpickles the class and makes one instance at start.
Per object it calls, as AIStore's runtime does:

* ``transform(data, path, etl_args)``: ``data`` is the object's bytes, or, when
  ``ETL_DIRECT_FQN`` is true and the target sent the object's file
  (``etl_fqn``), the file's path as a ``str``; ``path`` is ``bucket/object``;
  ``etl_args`` is the GET's ``etl_args`` or ``""``;
* ``transform_stream(reader, path, etl_args)`` when the class overrides only
  that (the SDK's own rule: ``transform`` wins if both are): ``reader`` is the
  object's file opened for reading when the target sent its path, else a
  ``BytesIO`` of the bytes; the chunks it yields are streamed to the client
  one by one, and the reader is closed after the last.

What it raises is a ``TransformError`` (422 naming the ETL and the object),
what it returns follows ``calls.result_of``. The base class's ``__init__``
wants ``AIS_TARGET_URL`` (the AIStore target to fetch from, for ``hpull``);
Sluice always hands the object over itself, so a placeholder is set when the
environment has none.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

import cloudpickle

from etl_runtime.core.errors import CodeLoadError, SluiceError
from etl_runtime.core.spec import CodeSpec
from etl_runtime.webserver import calls

TARGET_URL_ENV = "AIS_TARGET_URL"
NO_TARGET_URL = "http://ais-target-url.unused-by-sluice.invalid"
TRUE = ("true", "1", "yes", "y", "on")


class AisClassHandler(calls.ObjectHandler):
    """One instance of the user's class and the way to call it."""

    def __init__(self, instance: Any, direct_fqn: bool, streaming: bool) -> None:
        self.instance = instance
        self.direct_fqn = direct_fqn
        self.streaming = streaming

    def handle(self, data: bytes | None, fqn: str | None, obj: str, args: str | None) -> Any:
        etl_args = args or ""
        if self.streaming:
            reader: BinaryIO = calls.open_fqn(fqn) if fqn is not None else io.BytesIO(data or b"")
            try:
                chunks = self.instance.transform_stream(reader, obj, etl_args)
            except Exception as e:
                reader.close()
                raise calls.raised(e) from e
            return _closing(chunks, reader)
        source: bytes | str | None = data
        if fqn is not None:
            source = fqn if self.direct_fqn else calls.read_fqn(fqn)
        try:
            return self.instance.transform(source, obj, etl_args)
        except SluiceError:
            raise
        except Exception as e:
            raise calls.raised(e) from e


def _closing(chunks: Any, reader: BinaryIO) -> Iterator[Any]:
    """``chunks`` one by one (an error in them is the user's), then close ``reader``."""
    try:
        if isinstance(chunks, str | bytes | bytearray | memoryview):
            yield chunks
            return
        iterator = iter(calls.result_of(chunks))
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                return
            except SluiceError:
                raise
            except Exception as e:
                raise calls.raised(e) from e
            yield item
    finally:
        reader.close()


def _overrides(cls: type, name: str) -> bool:
    """True when ``cls`` defines ``name`` below the SDK's ``ETLServer``."""
    for klass in cls.__mro__:
        if klass.__name__ == "ETLServer":
            return False
        if name in vars(klass):
            return True
    return False


def load_class(code: CodeSpec) -> AisClassHandler:
    """Unpickle the class and make its instance (``CodeLoadError`` naming why not)."""
    os.environ.setdefault(TARGET_URL_ENV, NO_TARGET_URL)
    try:
        cls = cloudpickle.loads(base64.b64decode(code.ais_class or ""))
    except ModuleNotFoundError as e:
        raise CodeLoadError(
            f"the ETL class needs the module {e.name!r}, which this transformer runtime "
            "does not have: add its package to dependencies (init_class(dependencies="
            "[...])) or use a runtime image that has it"
        ) from e
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        raise CodeLoadError(f"cannot unpickle the ETL class (spec.code.aisClass): {why}") from e
    if not isinstance(cls, type):
        raise CodeLoadError(
            f"spec.code.aisClass holds a {type(cls).__name__}, not a class; send a subclass "
            "of aistore's ETLServer (init_class)"
        )
    has_transform, has_stream = _overrides(cls, "transform"), _overrides(cls, "transform_stream")
    if not has_transform and not has_stream:
        raise CodeLoadError(
            f"ETL class {cls.__name__} overrides neither transform nor transform_stream"
        )
    try:
        instance = cls()
    except Exception as e:
        raise CodeLoadError(
            f"ETL class {cls.__name__} failed to initialize: {type(e).__name__}: {e}"
        ) from e
    direct = getattr(instance, "direct_fqn", None)
    if not isinstance(direct, bool):
        direct = os.environ.get("ETL_DIRECT_FQN", "").strip().lower() in TRUE
    return AisClassHandler(instance, direct, streaming=has_stream and not has_transform)
