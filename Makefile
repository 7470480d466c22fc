# m2g — developer entry points. The README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv lock wheel image image-test test test-prereqs demo-prereqs test-unit test-e2e lint policy-test demo bench bench-controller bench-scale bench-eval bench-twin fuzz probe chaos up down status clean
.PHONY: cluster-build cluster-factory cluster-env

# constraints.txt pins every package of the dev environment (regenerate: make lock).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## lock: re-resolve the dev environment from pyproject.toml in a fresh venv, write constraints.txt
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q --upgrade pip
	.venv-lock/bin/pip install -q -e '.[dev,bench]'
	{ echo "# The dev environment, pinned (make lock regenerates it; make venv installs with it)."; \
	  .venv-lock/bin/pip freeze --all --exclude-editable --exclude pip | LC_ALL=C sort -f; } > constraints.txt
	rm -rf .venv-lock

## lint: ruff, mypy --strict, import-linter (the layering), policy lint
lint: $(STAMP)
	$(VENV)/bin/ruff check src controllers cli tests bench setup.py
	$(VENV)/bin/mypy src controllers cli
	$(VENV)/bin/lint-imports
	$(VENV)/bin/m2g policy lint policies/

## policy-test: the example policies' own test files, on both CEL engines
policy-test: $(STAMP)
	$(VENV)/bin/m2g policy test policies/
	$(VENV)/bin/m2g policy test policies/ --engine cel-python

## test-unit: everything that needs no cluster
test-unit: $(STAMP)
	$(PY) -m pytest -m "not e2e and not image" -q

## test-e2e: against the local control plane (built and started on demand), or against
## $$M2G_E2E_KUBECONFIG (e.g. kind) when set. The build runs first so its progress is shown.
test-e2e: $(STAMP)
	@if [ -z "$$M2G_E2E_KUBECONFIG" ]; then $(PY) kind-e2e/localcp build; fi
	bash kind-e2e/tools/build.sh helm
	$(PY) -m pytest -m "e2e and not image" -q

## test-prereqs / demo-prereqs: what the README's two commands need besides the venv, said in
## their first second with the exact command that installs each (kind-e2e/prereqs.py: Python
## >= 3.11 with venv; Go >= 1.26 unless the control plane is built; Debian's prometheus, and
## promtool for the tests). .ci/run installs prometheus first.
PREREQS = @command -v $(PYTHON) >/dev/null || { echo "make $(1): missing $(PYTHON):" \
	"sudo apt-get install -y python3 python3-venv" >&2; exit 1; }; $(PYTHON) kind-e2e/prereqs.py $(1)
test-prereqs:
	$(call PREREQS,test)

demo-prereqs:
	$(call PREREQS,demo)

## test: the full suite, as CI (.ci/run) runs it: the same tests, nothing skipped for a
## missing tool (test-prereqs; helm, which the chart's unit tests render with, is built
## first on a new machine) or CRD (the e2e fixtures install the extra CRDs)
test: test-prereqs
	bash kind-e2e/tools/build.sh helm
	$(MAKE) lint policy-test test-unit test-e2e

## bench: benchmarks (scripts, never timed assertions): the policy engine, then the controller
bench: $(STAMP)
	$(PY) bench/policy_bench.py
	$(MAKE) bench-controller

## fuzz: the hypothesis suites of tests/fuzz with many more examples than make test runs
## (FUZZ_EXAMPLES per target, default 2000; counts in .fuzz-counts.json, docs/reliability.md)
FUZZ_EXAMPLES ?= 2000
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz M2G_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) M2G_FUZZ_COUNTS=.fuzz-counts.json \
	  $(PY) -m pytest tests/fuzz -q

## probe: the hostile-input probe of the CLI (tests/fuzz/cli_probe.py) as subprocesses of the
## real m2g, each with a 45 s time limit and a 2 GiB address-space limit; counts by kind
probe: $(STAMP)
	$(PY) -m tests.fuzz.cli_probe --jobs 2

## chaos: the chaos e2e suites (tests/e2e/test_chaos_*.py, docs/reliability.md) on the local
## control plane, the seeded kill schedule (test_chaos_kill_e2e) once per seed of CHAOS_SEEDS
## (M2G_CHAOS_SEED; `make test` runs one random seed). Stops at the first failing seed.
CHAOS_SEEDS ?= 1 2 3 4 5 6 7 8
chaos: $(STAMP)
	@if [ -z "$$M2G_E2E_KUBECONFIG" ]; then $(PY) kind-e2e/localcp build; fi
	$(PY) -m pytest -m e2e -q tests/e2e/test_chaos_e2e.py tests/e2e/test_chaos_etcd_e2e.py \
	  tests/e2e/test_chaos_watch_e2e.py tests/e2e/test_chaos_prometheus_e2e.py
	for seed in $(CHAOS_SEEDS); do \
	  echo "chaos seed $$seed"; \
	  M2G_CHAOS_SEED=$$seed $(PY) -m pytest -m e2e -q tests/e2e/test_chaos_kill_e2e.py || exit 1; \
	done

## bench-eval: `m2g policy eval` streaming JSON Lines, both engines in one run (docs/reliability.md)
bench-eval: $(STAMP)
	$(PY) bench/eval_bench.py

## bench-controller: GridEvent -> sheds visible, on the 100-rack factory with 2,000 workloads
## (docs/benchmarks.md). Builds the control plane if needed and runs it in its own M2G_RUN
## (~/.cache/m2g/run-bench-large), stopped at the end. BENCH_ARGS: e.g. --factory small.
bench-controller: $(STAMP)
	$(PY) kind-e2e/localcp build
	$(PY) bench/controller_latency.py --up --down $(BENCH_ARGS)

## bench-scale: one reconcile of the pure core at 100 / 400 / 1,400 racks (2k / 20k / 100k
## workloads), each size in its own memory-limited subprocess (docs/benchmarks.md).
## BENCH_ARGS: e.g. --sizes 100,400.
bench-scale: $(STAMP)
	$(PY) bench/scale.py $(BENCH_ARGS)

## bench-twin: the Model-to-Grid twin (docs/twin.md): plain Kueue, then m2g, each on a fresh
## control plane with the 16-rack factory, replaying the openb trace through the dr-srp grid
## event; report.json/report.md/plots in bench-out/twin. Runs in $${M2G_RUN:-~/.cache/m2g/run-twin}
## (-kueue, -m2g), stopped at the end. TWIN_ARGS: e.g. --scenario cooling, --racks 2, --out DIR.
bench-twin: $(STAMP)
	$(PY) kind-e2e/localcp build
	M2G_RUN="$${M2G_RUN:-$$HOME/.cache/m2g/run-twin}" $(PY) bench/twin.py $(TWIN_ARGS)

## demo: the main job — control plane + small factory, simulator, Prometheus, `m2g run`, a
## workload mix, a grid event; shows what m2g deferred, shed and restored (docs/quickstart.md).
## Runs in $${M2G_RUN:-~/.cache/m2g/run-demo}; M2G_DEMO_KEEP=1 leaves it running.
demo: demo-prereqs $(STAMP)
	$(VENV)/bin/m2g policy test policies/
	M2G_RUN="$${M2G_RUN:-$$HOME/.cache/m2g/run-demo}" $(PY) demo/run_demo.py

## wheel: build the wheel (with the templates and example policies as package data) into dist/
wheel: $(STAMP)
	$(VENV)/bin/pip wheel -q --no-deps --no-build-isolation -w dist .

## image: the OCI image without Docker (image/build.sh: mmdebstrap + umoci, needs root and
## `apt-get install mmdebstrap umoci`) -> dist/m2g-<version>-oci.tar; not part of make test
image: $(STAMP)
	bash image/build.sh

## image-test: run m2g inside the built image's root filesystem (tests/image, needs make image),
## and the image's entry point as the chart's Deployment starts it, in-cluster, against the
## local control plane (tests/e2e/test_chart_install.py; needs root for chroot)
image-test: $(STAMP)
	@if [ -z "$$M2G_E2E_KUBECONFIG" ]; then $(PY) kind-e2e/localcp build; fi
	bash kind-e2e/tools/build.sh helm
	$(PY) -m pytest -m image tests/image tests/e2e/test_chart_install.py -q

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist

## --- local control plane (kind-e2e/, docs/control-plane.md) ---------------------------
LOCALCP := $(PY) kind-e2e/localcp
FACTORY ?= small

## up: start etcd, kube-apiserver, controller-manager, scheduler, KWOK, Kueue, JobSet + FACTORY (small)
up: $(STAMP)
	$(LOCALCP) up --factory $(FACTORY) $(if $(EXTRA_CRDS),--extra-crds $(EXTRA_CRDS))

## down: delete Kueue's and JobSet's webhooks, stop every component; no process is left behind
down: $(STAMP)
	$(LOCALCP) down

## status: components (pid, RSS, log), API server version, Ready nodes
status: $(STAMP)
	@$(LOCALCP) status || true

## cluster-build: build the pinned binaries into $${M2G_CACHE:-~/.cache/m2g}/bin (once)
cluster-build:
	bash kind-e2e/tools/build.sh

## cluster-factory: add a factory to the running control plane, e.g. make cluster-factory FACTORY=large
cluster-factory: $(STAMP)
	$(LOCALCP) factory apply $(FACTORY)

## cluster-env: print the export KUBECONFIG=... line
cluster-env: $(STAMP)
	@$(LOCALCP) env
