"""A small Dockerfile reader: enough to check what an image runs and as whom.

Joins continuation lines, drops comments, splits stages at ``FROM`` and
parses exec-form (JSON) ``ENTRYPOINT``/``CMD`` and ``LABEL`` key=value pairs.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

IMAGES = Path(__file__).resolve().parents[2] / "images"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, keyword: str) -> str | None:
        values = [v for k, v in self.instructions if k == keyword]
        return values[-1] if values else None

    def all(self, keyword: str) -> list[str]:
        return [v for k, v in self.instructions if k == keyword]

    def exec_form(self, keyword: str) -> list[str] | None:
        """``ENTRYPOINT``/``CMD`` as a list; shell form is refused (signals break)."""
        value = self.last(keyword)
        if value is None:
            return None
        parsed = json.loads(value)
        assert isinstance(parsed, list) and all(isinstance(p, str) for p in parsed), value
        return parsed

    def labels(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for value in self.all("LABEL"):
            for pair in shlex.split(value):
                key, _, val = pair.partition("=")
                out[key] = val
        return out


@dataclass
class Dockerfile:
    path: Path
    args: dict[str, str]  # ARGs declared before the first FROM, with defaults
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def resolve(self, text: str) -> str:
        """Expand ``${ARG}`` / ``$ARG`` from the global ARG defaults (which may use others)."""
        for _ in range(10):
            expanded = re.sub(
                r"\$\{(\w+)\}|\$(\w+)",
                lambda m: self.args.get(m.group(1) or m.group(2), m.group(0)),
                text,
            )
            if expanded == text:
                break
            text = expanded
        return text


def logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return lines


def parse(path: Path) -> Dockerfile:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            if keyword == "ARG":
                key, _, default = rest.partition("=")
                args[key] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(path=path, args=args, stages=stages)


def all_images() -> dict[str, Dockerfile]:
    return {p.parent.name: parse(p) for p in sorted(IMAGES.glob("*/Dockerfile"))}
