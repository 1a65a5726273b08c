"""Errors of the PyTorch datasets, on top of the SDK's hierarchy.

::

    SluiceError                 (etl_runtime.sdk.errors)
    └── DatasetError            a dataset cannot be built or read as asked
        ├── EmptySource         a bucket/prefix/template selected no object
        └── ShardError          a shard failed while it was being read (names it)

HTTP errors keep their SDK class (a missing bucket or object is ``NotFound``,
a transform failing on its first byte is ``TransformError``); they already
name the bucket and object. ``ShardError`` wraps what can go wrong after the
first byte (a broken stream, a corrupt tar, a sample that does not decode) so
an epoch never ends silently short.
"""

from __future__ import annotations

from etl_runtime.sdk.errors import SluiceError


class DatasetError(SluiceError):
    """A dataset cannot be built or read as asked; the message names the source."""


class EmptySource(DatasetError):
    """A source selected no object (a typo in a prefix should not train on nothing)."""


class ShardError(DatasetError):
    """A shard failed mid-read; ``bucket``/``object`` name it, ``__cause__`` says why."""
