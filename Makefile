# Developer entry points. `make test` is what CI runs (.ci/run).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

UV = $(shell hack/ensure-uv.sh)
RUN = $(UV) run --locked

# Compiled modules are written, so that the next process reuses them: with
# PYTHONDONTWRITEBYTECODE set, every operator, step and plugin process the tests start would
# compile what it imports again (kopf and the operator's own modules: about half a second of
# CPU per operator start on two cores).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

# The installed packages are compiled once here (uv does not by default), so that a process
# started outside make, where PYTHONDONTWRITEBYTECODE may be set, does not compile them (a
# model turn's pod, importing openai, spent about 0.9 s more CPU starting without them).
.PHONY: sync
sync: ## create .venv from the lockfile, its modules compiled
	$(UV) sync --locked --compile-bytecode

.PHONY: crds
crds: sync ## regenerate crds/ from the API models (and its copies for kustomize and Helm)
	$(RUN) agentrun crd -o crds/agentrun.dev_agentruns.yaml
	$(RUN) agentrun crd --kind Agent -o crds/agentrun.dev_agents.yaml
	$(RUN) agentrun crd --kind ModelConfig -o crds/agentrun.dev_modelconfigs.yaml
	hack/helm/sync-crds.sh

.PHONY: trust-table
trust-table: sync ## regenerate docs/design.md's trust table from agentrun.api.trust
	$(RUN) python -m agentrun.api.trust --update docs/design.md

# Where the krew archive is published (a release's assets): set it for a real release.
KREW_BASE_URL ?= https://github.com/OWNER/agentrun/releases/download

.PHONY: krew-manifest
krew-manifest: sync ## write dist/agentrun.yaml, the krew manifest of kubectl agentrun, and its archive
	$(RUN) python hack/krew/manifest.py --out dist --base-url $(KREW_BASE_URL)

.PHONY: lint
lint: sync ## ruff and mypy --strict
	$(RUN) ruff check operator tests hack
	$(RUN) ruff format --check operator tests hack
	$(RUN) mypy

.PHONY: controlplane
controlplane: ## build (or reuse) etcd, kube-apiserver, kube-controller-manager, kubectl
	hack/build-controlplane.sh >/dev/null

.PHONY: llama
llama: ## build (or reuse) llama-server and fetch (or reuse) the Gemma 3 270M model, for the real-model test
	hack/build-llama-server.sh >/dev/null
	hack/fetch-model.sh >/dev/null

.PHONY: unit
unit: sync ## unit and property tests only (no cluster), about 30 s
	$(RUN) pytest tests/unit

.PHONY: integration
integration: sync controlplane ## CRD, admission, node and packaging tests on the local control plane
	$(RUN) pytest tests/integration

.PHONY: e2e
e2e: sync controlplane llama ## the operator as a process on the local control plane: runs, crashes, RBAC
	$(RUN) pytest tests/e2e

# Test files spread over this many pytest-xdist workers, each with a cluster of its own: one more
# than the machine has CPUs, as most of an e2e test's time is spent waiting on steps and cuts,
# and at most 6 (each worker's control plane, node and operators hold about 1 GB).
PYTEST_WORKERS ?= $(shell w=$$(( $$(nproc) + 1 )); [ $$w -gt 6 ] && w=6; echo $$w)

.PHONY: test
test: lint controlplane llama ## what CI runs: lint, types, unit, property, integration, e2e and container tests (not kind)
	$(RUN) pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=20

.PHONY: containers
containers: sync controlplane ## the chart's operator and step pods as Docker containers (skips without Docker)
	$(RUN) pytest tests/containers

.PHONY: kind
kind: sync ## hack/e2e-kind.sh under pytest: kind cluster, image, chart, e2e (needs a registry, not in CI)
	$(RUN) pytest tests/kind

.PHONY: chart-scan
chart-scan: ## kube-score and checkov over the rendered chart (replicas 1 and 3); docs/install.md explains each finding
	hack/chart-scan.sh

.PHONY: soak
soak: sync controlplane ## the crash test with 100 operator kills (AGENTRUN_CRASH_KILLS), not in CI
	AGENTRUN_CRASH_KILLS=$${AGENTRUN_CRASH_KILLS:-100} $(RUN) pytest tests/e2e/test_crash.py -s \
		-k test_runs_survive_an_operator_killed_at_every_crash_point

.PHONY: faults
faults: sync controlplane ## the partition tests with the history test's cut at 5 minutes and a further 5 minute cut with no churn, not in CI
	AGENTRUN_HISTORY_CUT_SECONDS=$${AGENTRUN_HISTORY_CUT_SECONDS:-300} AGENTRUN_LONG_CUT_SECONDS=$${AGENTRUN_LONG_CUT_SECONDS:-300} $(RUN) pytest tests/e2e/test_partition.py -s

.PHONY: bench
bench: sync controlplane ## the operator beside bare Jobs and Argo (docs/benchmarks.md); its figures to docs/bench-runs, plots to docs/bench-plots (BENCH_ARGS=--quick: small)
	$(RUN) python hack/bench/bench.py $(BENCH_ARGS)

.PHONY: demo
demo: sync controlplane ## control plane, node, operator and an example run carried to Succeeded
	$(RUN) python -m agentrun_devcluster.demo

.PHONY: demo-agent
demo-agent: sync controlplane ## an agent run on a scripted model, offline: tool calls, an approval, the transcript
	$(RUN) python -m agentrun_devcluster.agent_demo

.PHONY: demo-llm
demo-llm: sync controlplane llama ## an agent run on a real model (llama-server, Gemma 3 270M on the CPU), offline
	$(RUN) python -m agentrun_devcluster.llm_demo

.PHONY: walkthrough
walkthrough: sync controlplane ## docs/approvals.md's walkthrough, end to end on a cluster of its own
	hack/walkthrough-approvals.sh

.PHONY: cluster
cluster: sync controlplane ## start a local control plane and node in the foreground
	$(RUN) agentrun devcluster up
