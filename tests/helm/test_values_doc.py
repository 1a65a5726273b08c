"""Every chart value is documented: commented in values.yaml, listed in docs/deploy.md."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

from tests.helm.chart import CHART, REPO

# Values whose content is a Kubernetes structure, documented as a whole.
OPAQUE = {"resources", "podSecurityContext", "containerSecurityContext"}


def value_paths(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and key not in OPAQUE:
            yield from value_paths(value, path)
        else:
            yield path


def test_every_value_is_in_the_deploy_guide_reference() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    guide = (REPO / "docs" / "deploy.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", guide, flags=re.MULTILINE))
    paths = set(value_paths(values))
    assert paths - documented == set(), "values missing from docs/deploy.md's reference"
    assert documented - paths == set(), "docs/deploy.md documents values that do not exist"


def test_every_leaf_value_has_a_comment_in_values_yaml() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z]\w*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = m.groups()
        nested = not rest.strip() and i + 1 < len(lines) and lines[i + 1].startswith(indent + " ")
        if nested and key not in OPAQUE:
            continue  # a section: its leaves carry the comments
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and "--" not in lines[j]:
            j -= 1
        if j < 0 or not lines[j].strip().startswith("# --"):
            undocumented.append(key if not indent else f"{key} (line {i + 1})")
    # Keys inside an OPAQUE block (requests:, cpu: ...) are Kubernetes fields.
    undocumented = [k for k in undocumented if not _inside_opaque(lines, k)]
    assert not undocumented, f"values.yaml keys without a '# --' comment: {undocumented}"


def _inside_opaque(lines: list[str], entry: str) -> bool:
    m = re.search(r"\(line (\d+)\)", entry)
    if not m:
        return False
    i = int(m.group(1)) - 1
    indent = len(lines[i]) - len(lines[i].lstrip())
    for j in range(i - 1, -1, -1):
        line = lines[j]
        if not line.strip() or line.strip().startswith("#"):
            continue
        this = len(line) - len(line.lstrip())
        if this < indent:
            key = line.strip().split(":")[0]
            if key in OPAQUE:
                return True
            indent = this
    return False


def test_deploy_guide_etl_example_is_a_valid_etl() -> None:
    """The ETL manifest users copy from docs/deploy.md parses and its code loads."""
    from etl_runtime.core.spec import EtlSpec

    guide = (REPO / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", guide, flags=re.S)
    (manifest,) = [yaml.safe_load(b) for b in blocks if "kind: ETL" in b]
    assert manifest["apiVersion"] == "sluice.dev/v1alpha1"
    spec = EtlSpec.from_dict(manifest["spec"])
    assert spec.mode == "wds" and spec.code.source
    namespace: dict[str, Any] = {}
    exec(compile(spec.code.source, "etl.yaml", "exec"), namespace)
    assert callable(namespace[spec.code.entrypoint])
