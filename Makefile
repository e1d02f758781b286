# The one entry point. `make demo` and `make test` install what they need.
.PHONY: all setup build demo test bench lint fmt doc clean

CARGO ?= cargo

all: build

# Checks the toolchain this project needs (Rust with clippy and rustfmt).
setup:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs)"; exit 1; }
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt

build: setup
	$(CARGO) build --workspace --release

# MXNet's KVStore tutorial, in Rust (the Clojure version comes with the jar).
demo: setup
	$(CARGO) run --release -q -p kvstore-core --example tutorial

# fmt, clippy, doc and every cargo suite; ends with one line `N passed, N failed`.
test: setup
	@bash scripts/test.sh

# Criterion benches, then the report: limit and store rows in one run, medians and
# ratios, written to target/bench/results.json.
bench: setup
	$(CARGO) bench -p kvstore-core --bench store
	$(CARGO) bench -p kvstore-core --bench report

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

clean:
	$(CARGO) clean
