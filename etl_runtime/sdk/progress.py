"""Progress bars (``tqdm``) for uploads and downloads: off unless asked for.

The SDK shows one when a call is made with ``progress=True``; the CLI asks for
one on ``put`` and ``get`` when its stderr is a terminal and ``--quiet`` is not
given. The bar goes to stderr, so a download written to stdout stays clean.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a bar is asked for: not by every process that reads
    from tqdm import tqdm


def byte_bar(progress: bool, total: int | None, desc: str) -> tqdm | None:
    """A bytes bar on stderr for ``desc``, or None when ``progress`` is false.

    ``total`` is None when the size is not known in advance (an ETL's output
    without ``Content-Length``): the bar then counts bytes and speed only.
    """
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        miniters=1,
        file=sys.stderr,
        dynamic_ncols=True,
    )
