# The one entry point. `make demo` and `make test` install what they need.
.PHONY: all setup setup-jvm setup-mpi build native jar python install repl demo test test-static test-rust test-java test-clojure test-projects test-python test-mpi test-torch2 fuzz chaos bench cluster-check cluster-run gpu-bundle lint fmt doc javadoc clean

CARGO ?= cargo
JAVA ?= java
# Cargo features of the JNI library: `make jar FEATURES=mpi` builds it with dist_sync
# over MPI (it then needs Open MPI at run time) as the artifact kvstore-mpi,
# target/kvstore-mpi-<version>.jar; the default artifact, kvstore
# (target/kvstore-<version>.jar), needs no MPI. target/kvstore.jar and
# target/kvstore-mpi.jar link to them.
FEATURES ?=
VERSION := $(shell bash scripts/version.sh)
ARTIFACT := kvstore$(if $(filter mpi,$(FEATURES)),-mpi)
JAR := target/$(ARTIFACT)-$(VERSION).jar
# What the jar is built from: it is rebuilt only when one of these changed.
# (kvstore-jni/java/src is the Java API; its tests, bench and examples are not in the jar.)
JAR_INPUTS := $(shell find kvstore kvstore-commit kvstore-core kvstore-cuda kvstore-mpi kvstore-jni clojure/src \
    -type f -not -path '*/target/*' -not -path 'kvstore-jni/java/test/*' \
    -not -path 'kvstore-jni/java/bench/*' -not -path 'kvstore-jni/java/examples/*' \
    2>/dev/null) Cargo.toml Cargo.lock scripts/jar.sh
# Clojure from Debian's packages (scripts/setup-jvm.sh installs them).
CLJ_CP := /usr/share/java/clojure.jar:/usr/share/java/spec.alpha.jar:/usr/share/java/core.specs.alpha.jar

all: build

# Checks the toolchain this project needs (Rust with clippy and rustfmt).
setup:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs)"; exit 1; }
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt

setup-jvm:
	@bash scripts/setup-jvm.sh

# Open MPI and libclang, for the `mpi` features.
setup-mpi:
	@bash scripts/setup-mpi.sh

build: setup
	$(CARGO) build --workspace --release

# The JNI library, target/release/libkvstore_jni.so (with FEATURES, if given).
native: setup $(if $(filter mpi,$(FEATURES)),setup-mpi)
	$(CARGO) build --release -p kvstore-jni $(if $(strip $(FEATURES)),--features "$(strip $(FEATURES))")

# The Python package's one wheel in target/wheels/: kvstore-<version>-cp310-abi3-manylinux*.whl,
# for CPython 3.10 and later, with dist_sync over Open MPI when the environment has one
# (`pip install "WHEEL[mpi]"` installs it from the package index; docs/python.md).
# `pip install ./kvstore-py` builds one without MPI from source.
python: setup
	@bash scripts/python-wheel.sh

# target/kvstore-<version>.jar (kvstore-mpi-<version>.jar with FEATURES=mpi) and its
# POM: the Java API, the Clojure namespaces and the native library; rebuilt only when
# a source changed.
jar: $(JAR)

$(JAR): $(JAR_INPUTS)
	@$(MAKE) --no-print-directory native setup-jvm
	@KVSTORE_ARTIFACT=$(ARTIFACT) bash scripts/jar.sh

# The jar and its POM into the local Maven repository (~/.m2/repository, or M2_REPO),
# as io.github.kvstore/kvstore (FEATURES=mpi: io.github.kvstore/kvstore-mpi), the
# version of Cargo.toml: Maven, Leiningen and deps.edn projects then resolve it offline.
install: jar
	@KVSTORE_ARTIFACT=$(ARTIFACT) bash scripts/install.sh

# A Clojure REPL with the jar and the kvstore, ndarray, context and optimizer namespaces
# required (through rlwrap, for line editing and history, when it is installed).
RLWRAP := $(shell command -v rlwrap 2>/dev/null)
repl: jar
	@$(if $(RLWRAP),,echo "(for line editing and history: apt-get install rlwrap)")
	@$(RLWRAP) $(JAVA) -cp $(JAR):$(CLJ_CP) clojure.main -e "(require '[org.apache.clojure-mxnet.kvstore :as kvstore] '[org.apache.clojure-mxnet.ndarray :as ndarray] '[org.apache.clojure-mxnet.context :as context] '[org.apache.clojure-mxnet.optimizer :as optimizer])" -r

# MXNet's KVStore tutorial, in Rust, in Clojure (the seed tutorial, verbatim) and in
# Python (MXNet's Python tutorial with numpy);
# then a linear regression trained data-parallel on 4 cpu contexts with SGD (momentum).
demo: jar python
	@echo "== the KVStore tutorial in Rust (cargo run --example tutorial) =="
	$(CARGO) run --release -q -p kvstore-core --example tutorial
	@echo "== the KVStore tutorial in Clojure (clojure/examples/tutorial.clj) =="
	$(JAVA) -cp $(JAR):$(CLJ_CP) clojure.main clojure/examples/tutorial.clj
	@echo "== the KVStore tutorial in Python (kvstore-py/examples/tutorial.py) =="
	bash scripts/python-demo.sh
	@echo "== data-parallel training with an optimizer, in Rust (cargo run --example train_linear) =="
	$(CARGO) run --release -q -p kvstore-core --example train_linear
	@echo "== data-parallel training with an optimizer, in Clojure (clojure/examples/train_linear.clj) =="
	$(JAVA) -cp $(JAR):$(CLJ_CP) clojure.main clojure/examples/train_linear.clj

# fmt, clippy, doc, every cargo suite, the jar, JUnit, clojure.test, the tutorial, the
# Leiningen/deps.edn smoke checks and the MPI suite under mpirun; ends with one line
# `N passed, N failed`.
test: setup setup-jvm
	@bash scripts/test.sh

# One group of `make test` each (scripts/test.sh lists what each runs); each ends with
# its own `N passed, N failed`.
test-static test-rust test-java test-clojure test-projects test-python test-mpi: setup setup-jvm
	@bash scripts/test.sh $(@:test-%=%)

# kvstore.torch and the PyTorch interop tests against PyTorch 2.x from PyPI (about
# 5.4 GB, kept in target/py-torch2-venv; make test uses Debian's small torch 1.13).
test-torch2: setup
	@bash scripts/test-python-torch2.sh

# A cluster in a box (scripts/cluster.sh): HOSTS (2 to 4) network namespaces of this
# machine, SLOTS ranks each, their links shaped to RATE (1gbit, 10gbit, 25gbit; empty:
# not shaped), and `mpirun MPIRUN_ARGS` run across them, then everything removed.
# `make cluster-run MPIRUN_ARGS="-np 4 target/debug/fixture_train_job dist_sync 3"`.
# `make cluster-check` says whether namespaces can be made here. Needs root.
HOSTS ?= 2
SLOTS ?= 2
RATE ?= 10gbit
cluster-check:
	@bash scripts/cluster.sh check && echo "network namespaces can be made here"

cluster-run: setup-mpi
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash scripts/cluster.sh run -n $(HOSTS) \
	    -s $(SLOTS) $(if $(RATE),-r $(RATE)) -- --oversubscribe --bind-to none $(MPIRUN_ARGS)

# The state-file loader fuzzed with many more mutated files than `make test` runs
# (FUZZ_CASES, default 20000): never a panic, never a file that loads other states.
FUZZ_CASES ?= 20000
fuzz: setup
	KVSTORE_FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test --release -p kvstore-tests --test main \
	    hostile::mutated_state_files_never_panic_and_never_load_other_states -- --exact

# The chaos suite with many more runs than `make test`'s 6 (CHAOS_RUNS, default 100):
# a 4-rank dist_sync training job that checkpoints every 4 steps, a random rank killed
# (SIGKILL) or stopped (SIGSTOP) at a random moment; every job must end (no hang), every
# checkpoint load, and a job resumed from the latest (on 4 or 2 ranks) train on. Ends
# with the summary: runs, kills, stops, hangs, watchdog endings, checkpoints, resumes.
# Then the commits' chaos (COMMIT_CHAOS_RUNS, default 30; `make test` runs 3): a 2-rank
# job under kvstore-run, a random rank killed at a random moment; every run must end
# well with the bits of a job never killed (kvstore-mpi/tests/commits.rs).
CHAOS_RUNS ?= 100
COMMIT_CHAOS_RUNS ?= 30
chaos: setup
	@bash scripts/setup-mpi.sh >/dev/null
	KVSTORE_CHAOS_RUNS=$(CHAOS_RUNS) $(CARGO) test -q -p kvstore-mpi --features mpi --test chaos
	KVSTORE_COMMIT_CHAOS_RUNS=$(COMMIT_CHAOS_RUNS) $(CARGO) test -q -p kvstore-mpi --features mpi --test commits \
	    chaos -- --nocapture

# Criterion benches; the Java, Clojure, MPI (2 ranks), GPU and Python benches; then the report:
# limit, store, JVM, MPI, GPU and Python rows, medians and ratios, written to target/bench/results.json.
bench: jar
	$(CARGO) bench -p kvstore-core --bench store
	mkdir -p target/bench/java-classes
	javac --release 17 -Xlint:all -Werror -cp $(JAR) -d target/bench/java-classes \
	    kvstore-jni/java/bench/io/github/kvstore/bench/JvmBench.java
	$(JAVA) -cp $(JAR):target/bench/java-classes io.github.kvstore.bench.JvmBench target/bench/jvm-java.json
	$(JAVA) -cp $(JAR):$(CLJ_CP) clojure.main clojure/bench/kvstore_bench.clj target/bench/jvm-clojure.json
	bash scripts/setup-mpi.sh
	# Over shared memory, then again over TCP (loopback): allreduce latency closer to a
	# network's than shared memory's.
	# (The shared-memory run also times a commit after a step: a job name of its own,
	# its commits removed after. Then dist_sync owners against the replicated layout on
	# 2 and 4 ranks. Then a job under kvstore-run whose rank is killed: the time to its
	# first step after the restart, on 2 and 3 ranks.)
	mpi=$$(bash bench/exe.sh kvstore-mpi mpi --features mpi) && \
	job=bench-commit-$$$$ && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 KVSTORE_JOB=$$job mpirun --oversubscribe \
	    --bind-to none -np 2 -x KVSTORE_JOB "$$mpi" target/bench/mpi.json && \
	rm -rf /dev/shm/kvstore-$$(id -u)-$$job && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 KVSTORE_BENCH_LABEL="mpi 2 ranks over tcp" \
	    KVSTORE_BENCH_OVERLAP=1 mpirun --oversubscribe --bind-to none --mca btl self,tcp -np 2 \
	    -x KVSTORE_BENCH_LABEL -x KVSTORE_BENCH_OVERLAP \
	    "$$mpi" target/bench/mpi-tcp.json && \
	for np in 2 4; do \
	    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 KVSTORE_BENCH_OWNERS=only mpirun --oversubscribe \
	        --bind-to none -np $$np -x KVSTORE_BENCH_OWNERS "$$mpi" target/bench/mpi-owners-$$np.json || exit 1; \
	done && \
	restart=$$(bash bench/exe.sh kvstore-mpi restart --features mpi) && \
	"$$restart" target/bench/restart.json
	# GPU rows when this machine has a CUDA device (otherwise they print SKIP), and
	# PyTorch's a+b+c+d on the same arrays when PyTorch is installed.
	rm -f target/bench/gpu.json target/bench/torch.json
	$(CARGO) bench -p kvstore-cuda --bench gpu -- target/bench/gpu.json
	python3 bench/torch_tensors.py target/bench/gpu.json target/bench/torch.json
	# kvstore from Python (numpy) and MXNet 1.9.1's own store, timed in turn in one
	# process (venv target/py-mxnet-venv, made when missing).
	bash bench/python.sh target/bench/python.json
	# PyTorch: DDP (gloo) against kvstore.torch over dist_sync, 2 ranks, the same model.
	bash bench/torch-dp.sh target/bench/torch-dp.json
	# Across hosts made as network namespaces (scripts/cluster.sh), where they can be
	# made: a 64 MB push against the link's bound and gloo, and 2-bit compression at 1 Gbit/s.
	bash bench/cluster.sh target/bench/cluster.json
	$(CARGO) bench -p kvstore-core --bench report

# kvstore-cuda's GPU tests (release) and a run script in target/gpu-bundle, for a GPU
# machine with no Rust toolchain: `bash target/gpu-bundle/run.sh OUT_DIR` there.
gpu-bundle: setup
	@bash scripts/gpu-bundle.sh

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

# The Java API's documentation, target/javadoc (fails on any warning).
javadoc: setup-jvm
	@bash scripts/javadoc.sh

clean:
	$(CARGO) clean
