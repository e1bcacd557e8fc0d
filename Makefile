# Developer entry points. Keep each target a thin call into a script, so CI (.ci/run) and people
# run the same thing. Other targets (run, test, lint) live below the cluster ones.
SHELL := /bin/bash
.DEFAULT_GOAL := help

.PHONY: help cluster-build cluster-build-kueue cluster-up cluster-down cluster-purge

help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

# --- local control plane (docs/development.md) ----------------------------------------------
cluster-build: ## build etcd, kube-*, kubectl, kwok, helm from the Go module proxy (cached)
	hack/cluster/build.sh

cluster-build-kueue: ## also build Kueue's controller manager
	hack/cluster/build.sh kueue

cluster-up: cluster-build ## start the control plane with fake GPU nodes; kubeconfig in .cluster/kubeconfig
	hack/cluster/up.sh

cluster-down: ## stop the control plane (keeps .cluster/ logs)
	hack/cluster/down.sh

cluster-purge: ## stop the control plane and delete .cluster/
	hack/cluster/down.sh --purge

# --- the real worker node (docs/development.md): KWOK nodes only schedule, this one runs pods --
.PHONY: node-up node-down
node-up: ## add a real node (containerd, kubelet) to the running cluster; root; builds/installs what it needs
	hack/cluster/node-up.sh

node-down: ## remove the real node; leaves the machine as node-up found it
	hack/cluster/node-down.sh

# --- product and tests (README.md) ------------------------------------------------------------
VENV = $(shell hack/venv.sh)
PYTEST_ARGS ?=

.PHONY: venv run test test-unit lint crd images
venv: ## create/refresh the virtualenv (outside the repo, cached)
	@hack/venv.sh

run: ## train the tiny example on this machine: ftjob run examples/tiny-cpu.yaml
	$(VENV)/bin/ftjob run --fresh examples/tiny-cpu.yaml

test: cluster-build lint ## everything CI runs: lint, unit, trainer (CPU), control-plane, real-node and image tests
	PATH="$(VENV)/bin:$$PATH" $(VENV)/bin/python -m pytest $(PYTEST_ARGS)

test-unit: ## fast tests only (no cluster, no training)
	$(VENV)/bin/python -m pytest tests/unit $(PYTEST_ARGS)

lint: ## ruff + import-linter layer contracts + mypy --strict (pyproject's [tool.mypy]) + hadolint
	$(VENV)/bin/ruff check api operator trainer tests
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy api operator trainer
	$(VENV)/bin/hadolint Dockerfile

images: ## build localhost/finetune-operator/{operator,trainer}:dev with buildah; loaded into the real node when up
	hack/images.sh

crd: ## regenerate crds/finetunejob.yaml from the API models
	$(VENV)/bin/ftjob crd --out crds/finetunejob.yaml
