# draguard — every target creates or reuses .venv and installs what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: all prereqs venv test test-fast lint typecheck k8s image demo demo-down review bench reliability clean

all: test

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@# The tests and dev tools import the repository's own layout (`webhook`, `driver` at the top) from
	@# any working directory; the editable install itself names them draguard.webhook, draguard.driver.
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "draguard-repository.pth").write_text(str(pathlib.Path.cwd()) + "\n")'
	@touch $(STAMP)

venv: $(STAMP)

## System prerequisites of demo and test (Go, gcc, libseccomp, debootstrap, iptables, root, disk), checked
## first; as root, missing Debian packages are installed, otherwise the exact command is printed.
prereqs:
	@bash scripts/prereqs.sh $(if $(filter demo,$(MAKECMDGOALS)),demo,test)

## The Kubernetes binaries: the control plane and the node's kubelet, kube-proxy, containerd, runc,
## CNI plugins and crictl (cached outside the tree; a no-op when present).
k8s:
	bash scripts/build-k8s.sh
	bash scripts/build-node.sh

## The draguard image and the pause image as OCI archives for containerd, from image/recipe.toml
## (cached under ~/.cache/draguard/images; needs root, debootstrap and the Debian mirror apt uses).
image: $(STAMP)
	$(PY) -m webhook.dev.image build

lint: $(STAMP)
	$(VENV)/bin/ruff check draguard setup.py webhook driver tests bench
	$(VENV)/bin/mypy --strict webhook driver

## The whole test suite: lint, types, unit, integration, end-to-end against a real local API server.
## The bundle tests build kustomizations with kubectl (or kustomize); a machine without either uses the
## kubectl `make k8s` built, found after the machine's own.
test: prereqs $(STAMP) k8s lint
	@k8s_bin="$$($(PY) -c 'from webhook.dev.procs import find_bin_dir; print(find_bin_dir())')" || exit 1; \
	PATH="$$PATH:$$k8s_bin" $(PY) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

## Without the end-to-end tests (no Kubernetes build needed).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not e2e"

## The main job: a local control plane with a simulated GPU node, walking through the seed scenarios.
demo: prereqs $(STAMP) k8s
	$(VENV)/bin/draguard demo

demo-down: $(STAMP)
	$(VENV)/bin/draguard demo --down

## Offline review of the example GitOps repository (no cluster needed).
review: $(STAMP)
	$(VENV)/bin/draguard review examples/ --inventory examples/inventory.yaml

## Every benchmark with a summary (bench/run_all.py; BENCH_ARGS=--quick for a smoke run).
bench: $(STAMP)
	$(PY) bench/run_all.py $(BENCH_ARGS)

## Load, fault, bad-input and security tests (DRAGUARD_SOAK=1 for the long variants).
reliability: $(STAMP)
	$(PY) -m pytest -q -m reliability tests/reliability

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
