# ai-load-balancer — build, check, test, benchmark, package.
# `make test` is what CI runs (.ci/run); `make run` starts a local gateway (see README).

CARGO        ?= cargo
WASM_TARGET  := wasm32-wasip1
DIST         := dist
RAW_WASM     := target/$(WASM_TARGET)/release/ai_load_balancer.wasm
ENVOY_RAW    := target/envoy/$(WASM_TARGET)/release/ai_load_balancer.wasm
WASM_ABI     := tools/wasm-abi/target/release/wasm-abi
HIGRESS_WASM := $(DIST)/ai-load-balancer.wasm
ENVOY_WASM   := $(DIST)/ai-load-balancer-envoy.wasm
ABI021_WASM  := $(DIST)/testdata/ai-load-balancer-abi021-only.wasm

.PHONY: all build check-abi test unit-test wasm-unit-test lint fmt bench package clean tools e2e-build e2e-test run

E2E_BIN      := e2e/target/release
E2E_CARGO    := cd e2e && $(CARGO)

all: build

tools:
	$(CARGO) build --release --quiet --manifest-path tools/wasm-abi/Cargo.toml

# The Higress artifact: release, LTO, size-optimised, panic=abort (Cargo.toml), then the SDK's
# proxy_abi_version_0_2_1 export removed so Higress selects 0_2_100 (design §1).
build: tools
	$(CARGO) build --release --target $(WASM_TARGET) --lib
	mkdir -p $(DIST)/testdata
	$(WASM_ABI) strip $(RAW_WASM) $(HIGRESS_WASM) proxy_abi_version_0_2_1
	# Test fixture: the same module exporting only 0_2_1, to show the body starvation it causes.
	$(WASM_ABI) strip $(RAW_WASM) $(ABI021_WASM) proxy_abi_version_0_2_100
	# The plain-Envoy artifact: standard proxy-wasm 0.2.1 imports only (design §1).
	$(CARGO) build --release --target $(WASM_TARGET) --lib --features envoy --target-dir target/envoy
	cp $(ENVOY_RAW) $(ENVOY_WASM)
	@ls -l $(HIGRESS_WASM) $(ENVOY_WASM)

check-abi: build
	$(WASM_ABI) check $(HIGRESS_WASM) --host higress
	$(WASM_ABI) check $(ENVOY_WASM) --host envoy

unit-test:
	$(CARGO) test --quiet --workspace
	$(CARGO) test --quiet --manifest-path tools/wasm-abi/Cargo.toml

# The plugin's unit tests compiled for wasm32-wasip1 and run in the emulator's wasmtime
# (catches 32-bit and WASI differences).
wasm-unit-test: e2e-build
	CARGO_TARGET_WASM32_WASIP1_RUNNER="$(CURDIR)/$(E2E_BIN)/wasi-run" $(CARGO) test --quiet -p ailb-core --target $(WASM_TARGET) --lib

e2e-build:
	$(E2E_CARGO) build --release --quiet --bins

# Emulator host rules, fake pods, and the plugin end to end (real redis-server, several
# gateway processes, fake pods). Needs `make build` for dist/ai-load-balancer.wasm.
e2e-test: build e2e-build
	$(E2E_CARGO) test --release --quiet

# README's first command: Redis + 3 fake pods + one gateway with the example config.
run: build e2e-build
	$(E2E_BIN)/ailb-run $(ARGS)

# Import loops (tools/import-loops.py): e2e crates only for now; core/src and src/ join once
# their restructure lands.
IMPORT_LOOP_DIRS := e2e/gateway e2e/fakepod e2e/suite e2e/gateway/testdata/testplugin

lint:
	$(CARGO) fmt --check
	python3 tools/import-loops.py $(IMPORT_LOOP_DIRS)
	$(E2E_CARGO) fmt --check
	$(E2E_CARGO) clippy --quiet --release --all-targets -- -D warnings
	$(CARGO) clippy --quiet --workspace --all-targets -- -D warnings
	$(CARGO) clippy --quiet --workspace --target $(WASM_TARGET) --lib -- -D warnings
	$(CARGO) clippy --quiet --target $(WASM_TARGET) --lib --features envoy -- -D warnings
	$(CARGO) clippy --quiet --manifest-path tools/wasm-abi/Cargo.toml -- -D warnings

# Everything CI checks. Redis tests start their own redis-server on a free port.
test: lint unit-test check-abi package wasm-unit-test e2e-test
	@echo "make test: all checks passed"

bench: build e2e-build
	$(CARGO) run --profile bench-native --quiet -p ailb-core --example bench_redis
	$(CARGO) run --profile bench-native --quiet -p ailb-core --example bench_parse
	$(E2E_BIN)/ailb-bench

# Higress plugin-market layout: plugin.tar.gz (holding plugin.wasm) beside spec.yaml and README.
package: build
	rm -rf $(DIST)/oci && mkdir -p $(DIST)/oci/layer
	cp $(HIGRESS_WASM) $(DIST)/oci/layer/plugin.wasm
	tar -C $(DIST)/oci/layer -czf $(DIST)/oci/plugin.tar.gz plugin.wasm
	cp plugin-config/spec.yaml $(DIST)/oci/spec.yaml
	cp README.md $(DIST)/oci/README.md
	rm -rf $(DIST)/oci/layer
	@tar -tzf $(DIST)/oci/plugin.tar.gz | grep -qx plugin.wasm && ls -l $(DIST)/oci

fmt:
	$(CARGO) fmt

clean:
	$(CARGO) clean
	rm -rf $(DIST)
