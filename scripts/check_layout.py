"""Checks of the layout that import-linter does not make (run by ``make lint``).

* a module of the servers, the SDK or the operator longer than 400 lines is
  reported (one that grows past ~400 is usually two ideas: look, and split it
  by concept where it is), one longer than 600 fails the check; ``EXEMPT``
  names the modules allowed past 600, and why. A size rule is a prompt to
  look, never a reason to squeeze (docs/architecture.md, "Layers");
* each exception class name is defined once across the server code (the
  SDK keeps its own public exceptions, mapped from the wire in one place).

The layer contracts themselves are in ``pyproject.toml`` (``lint-imports``).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

LOOK_AT_LINES = 400  # reported
MAX_LINES = 600  # fails
EXEMPT = {
    "etl_runtime/core/errors.py": "the one error tree: every server error class, in one file",
}
ROOTS = [Path("etl_runtime"), Path("operator/etl_operator")]
CLIENT = ("etl_runtime/sdk/", "etl_runtime/pytorch/", "etl_runtime/cli/")


def _is_exception(node: ast.ClassDef, known: set[str]) -> bool:
    for base in node.bases:
        name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
        if name in known or name.endswith(("Error", "Exception")) or name == "Exception":
            return True
    return False


def main() -> int:
    problems: list[str] = []
    defined: dict[str, list[str]] = defaultdict(list)
    files = sorted(p for root in ROOTS for p in root.rglob("*.py"))
    trees = {p: ast.parse(p.read_text(), str(p)) for p in files}
    known: set[str] = set()
    for _ in range(3):  # subclasses of subclasses, whatever the file order
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and _is_exception(node, known):
                    known.add(node.name)
    for path, tree in trees.items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and path.as_posix() not in EXEMPT:
            problems.append(f"{path}: {lines} lines (at most {MAX_LINES}: split it by concept)")
        elif lines > LOOK_AT_LINES:
            why = EXEMPT.get(path.as_posix(), "is it two ideas?")
            print(f"note: {path}: {lines} lines, over {LOOK_AT_LINES} ({why})")
        if str(path).startswith(CLIENT):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in known:
                defined[node.name].append(f"{path}:{node.lineno}")
    for name, places in sorted(defined.items()):
        if len(places) > 1:
            problems.append(f"exception {name} is defined {len(places)} times: {', '.join(places)}")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
