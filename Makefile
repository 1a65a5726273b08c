# Sluice — one command to run the demo, one to test.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
CACHE   := $(HOME)/.cache/sluice
UV      := $(CACHE)/tools/bin/uv
STAMP   := $(VENV)/.installed

.PHONY: install lock canary demo test lint unit tools k8s-tools minio fake-gcs azurite browser k8s-up k8s-down bench clean images

install: $(STAMP)

# the uv that wrote uv.lock
UV_VERSION := 0.13.9

$(UV):
	mkdir -p $(CACHE)
	$(PY) -m venv $(CACHE)/tools
	$(CACHE)/tools/bin/pip install -q 'uv==$(UV_VERSION)'

# Exactly what uv.lock says (--frozen: the lock as committed, never re-resolved;
# `make lock` after editing pyproject.toml's dependencies), the checkout editable.
# --inexact leaves what else is in .venv (pip, a test's extra installs) alone.
EXTRAS := --extra server --extra dev --extra torch
SYNC := $(UV) sync -q --frozen --inexact
# make test and make demo let Python write its .pyc files (under .venv and the
# checkout's __pycache__, both ignored by git) where PYTHONDONTWRITEBYTECODE is set
# (as on CI machines): else every process compiles each module it imports: a
# target's start took 4.5 CPU-s instead of 2. Only what is imported is compiled,
# once (compiling all of .venv at install took 100 CPU-s).
WRITE_PYC := env -u PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml uv.lock | $(UV)
	test -x $(BIN)/python || $(UV) venv -q --seed --python $(PY) $(VENV)
	$(SYNC) $(EXTRAS)
	touch $(STAMP)

# The images install the lock's versions too: images/locked/*.txt, exported from it.
EXPORT = $(UV) export -q --frozen --no-hashes --no-emit-project --no-header --no-annotate
# the runtime image's CPU torch: its dependencies' versions (torch itself: the Dockerfile's ARGs)
NOT_TORCH := --no-emit-package torch --no-emit-package torchvision
LOCKED_TORCH = $(EXPORT) --extra torch | sed -n 's/^$(1)==\([^ ;]*\).*/\1/p'

lock: | $(UV)  # after a change to pyproject.toml's dependencies: re-resolve uv.lock
	$(UV) lock
	$(EXPORT) --extra server -o images/locked/server.txt
	$(EXPORT) --extra ais -o images/locked/ais.txt
	$(EXPORT) --extra torch $(NOT_TORCH) -o images/locked/torch.txt

# The wire tests (the contract tests of uvicorn's internals among them) against the
# newest uvicorn, starlette, httptools and fastapi, in a venv of their own: the
# rest as locked. A failure names the hook that changed (tests/wire/test_contracts.py).
CANARY := $(CACHE)/canary
CANARY_TESTS ?= tests/wire
CANARY_LIBS := uvicorn starlette httptools fastapi

canary: install
	rm -rf $(CANARY) && mkdir -p $(CACHE)
	$(UV) venv -q --seed --python $(BIN)/python $(CANARY)
	$(UV) export -q --frozen --no-hashes --no-emit-project --extra server --extra dev \
		-o $(CANARY)/locked.txt
	$(UV) pip install -q --python $(CANARY)/bin/python -r $(CANARY)/locked.txt
	$(UV) pip install -q --python $(CANARY)/bin/python --upgrade $(CANARY_LIBS:%=--refresh-package %) $(CANARY_LIBS)
	$(UV) pip install -q --python $(CANARY)/bin/python --no-deps -e .
	$(CANARY)/bin/python -c 'from importlib.metadata import version as v; \
		print("canary:", *(f"{p} {v(p)}" for p in ("uvicorn", "starlette", "httptools", "fastapi")))'
	$(CANARY)/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) $(CANARY_TESTS)

# The demo needs the servers and torch, not the dev tools (boto3, awscli, pyarrow,
# playwright...): from a fresh clone it syncs those two extras only (make install
# adds the rest later; --inexact keeps what is there).
DEMO_STAMP := $(VENV)/.installed-demo

$(DEMO_STAMP): pyproject.toml uv.lock | $(UV)
	test -x $(BIN)/python || $(UV) venv -q --seed --python $(PY) $(VENV)
	$(SYNC) --extra server --extra torch
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(WRITE_PYC) $(BIN)/python examples/demo.py

lint: install
	$(UV) lock --check  # uv.lock is pyproject.toml's resolution (else: make lock)
	$(EXPORT) --extra server | diff -u images/locked/server.txt -
	$(EXPORT) --extra ais | diff -u images/locked/ais.txt -
	$(EXPORT) --extra torch $(NOT_TORCH) | diff -u images/locked/torch.txt -
	grep -qx "ARG TORCH_VERSION=$$($(call LOCKED_TORCH,torch))" images/runtime/Dockerfile
	grep -qx "ARG TORCHVISION_VERSION=$$($(call LOCKED_TORCH,torchvision))" images/runtime/Dockerfile
	$(BIN)/ruff check .
	$(BIN)/ruff format --check etl_runtime operator tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports  # the layer contracts in pyproject.toml (docs/architecture.md)
	$(BIN)/python scripts/check_layout.py

k8s-tools:
	bash scripts/k8s-tools.sh

minio:
	bash scripts/minio.sh

fake-gcs:  # the GCS emulator of the gcp:// tests (tests/providers/test_gcp.py)
	bash scripts/fake-gcs.sh

azurite:  # the Azure Blob emulator of the az:// tests (tests/providers/test_azure.py)
	bash scripts/azurite.sh

browser:
	bash scripts/browser.sh

tools:  # all of the above at once: one apt-get, the Go builds beside the images (scripts/tools.sh)
	bash scripts/tools.sh

images:  # localhost/sluice/{server,runtime,operator}:dev, no registry (docs/deploy.md)
	bash scripts/images.sh

# Two pytest-xdist workers: the suite waits on servers about half the time, so two
# keep both cores busy (tests sharing a cluster stay on one worker: tests/conftest.py).
TEST_WORKERS ?= 2

# tools (the Go builds: the CPUs) beside everything else: install (uv's downloads),
# lint, then pytest, whose tests that need a tool wait for the lane (scripts/test.sh).
test:
	TEST_WORKERS=$(TEST_WORKERS) MAKE="$(MAKE)" bash scripts/test.sh

k8s-up: install k8s-tools
	$(BIN)/python -m tests.k8s.cluster up

k8s-down:
	$(BIN)/python -m tests.k8s.cluster down

bench: install
	$(BIN)/python bench/get_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
