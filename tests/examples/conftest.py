"""Fixtures for the examples' tests: a real local cluster and the pets step modules.

The example scripts live in ``examples/pets/`` (not a package; the step files'
names start with a digit), so they are loaded the way ``examples/demo.py``
loads them: ``workflow.py`` by path, the steps through ``workflow.load_step``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from etl_runtime import Client
from tests.servers import free_port

PETS = Path(__file__).resolve().parents[2] / "examples" / "pets"


def _load_workflow() -> ModuleType:
    name = "examples_pets_workflow"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PETS / "workflow.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="package")
def workflow() -> ModuleType:
    return _load_workflow()


@pytest.fixture(scope="package")
def steps(workflow: ModuleType) -> dict[str, ModuleType]:
    """``make_dataset``, ``convert``, ``register`` and ``train`` step modules."""
    names = {
        "make_dataset": "make_dataset",
        "convert": "1_convert",
        "register": "2_register_etl",
        "train": "3_train",
    }
    return {key: workflow.load_step(module) for key, module in names.items()}


@pytest.fixture(scope="package")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    """A client on a fresh local cluster; two targets keep the 2-core CI box responsive."""
    from etl_runtime.local.up import LocalCluster  # imported late: a server-side module

    data_dir = tmp_path_factory.mktemp("pets-cluster")
    with LocalCluster(data_dir, targets=2, port=free_port()) as cluster:
        with Client(str(cluster.endpoint)) as c:
            yield c
