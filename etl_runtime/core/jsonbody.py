"""Reading a JSON request body with its nesting bounded.

``json.loads`` of ``[[[[...]]]]`` a few thousand levels deep raises
``RecursionError`` (a 500), and a merely deep document can blow the stack
later, wherever it is walked. Every JSON body Sluice takes is a few levels
deep, so more than ``MAX_DEPTH`` is refused with a 400 before it is parsed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request

from etl_runtime.core.errors import InvalidRequest

MAX_DEPTH = 32
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def nesting_depth(body: bytes) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text (strings do not count)."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRINGS.sub(b'""', body)):
        if m.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


async def read_json(request: Request, what: str) -> Any:
    """The body as JSON; ``InvalidRequest`` naming ``what`` if it is not JSON or too deep."""
    body = await request.body()
    if nesting_depth(body) > MAX_DEPTH:
        raise InvalidRequest(f"{what}: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:
        raise InvalidRequest(f"{what} must be JSON: {e}") from None
