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
