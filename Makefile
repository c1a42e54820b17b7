# One entry point per job. `make run` is the main job on an embedded default; `make test` runs every
# test (unit, integration, real-control-plane e2e) and is what CI runs.
SHELL := /bin/bash
export GOTOOLCHAIN := local
FILTER ?=

.PHONY: run test unit e2e lint bench bench-plugin bench-sim bench-peers bench-publish bench-scheduler bench-mig-latency bench-controller slices build clean-e2e nvidia-manifests

## The main job: which device would the scheduler give examples/claims/inference-gpu.yaml on a
## simulated H100 x8 node with dynamic MIG? (DeviceClasses and the node are embedded.)
run:
	cargo run -q -p dra-controller --bin dra-controller -- simulate examples/claims/inference-gpu.yaml

build:
	cargo build --workspace --all-targets

## Every test: unit + integration (cargo), then the real control plane (e2e/run.sh), then the
## container image packed from e2e's debug binaries (image-check-dev).
test: unit e2e image-check-dev

unit:
	@start=$$SECONDS; cargo test --workspace && \
	  (cd e2e/kubelet-tools && GOFLAGS=-mod=mod GOSUMDB=off CGO_ENABLED=0 go test ./...) && \
	  echo "unit tests took $$(( SECONDS - start ))s"

## Real-control-plane scenarios; `make e2e FILTER=s3` runs one, `E2E_KEEP=1` keeps the cluster up.
e2e:
	bash e2e/run.sh $(FILTER)

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	@# The plugin core builds without any Kubernetes or gRPC crate, directly or transitively.
	! cargo tree -p dra-plugin-core -e normal | grep -E 'kube|k8s-openapi|tonic|prost|hyper'

## Figures, not pass/fail: plugin prepare/unprepare latency + RSS, simulator vs the Go scheduler
## code. Each writes its rows of docs/perf.md (tools/perf-table.py).
bench: bench-plugin bench-sim

bench-plugin:
	set -o pipefail; cargo bench -p dra-plugin --bench prepare | python3 tools/perf-table.py docs/perf.md

## The cluster run's Go estimate takes the Go allocator's one-pod seconds over the same 5,000
## nodes from the first command (÷ 5,000: its cost per Filter call).
bench-sim:
	mkdir -p target; set -o pipefail; cargo run --release -p dra-sim --bin sim-bench -- --nodes 5000 --pods 10 | \
	  tee target/sim-bench-pod.txt | python3 tools/perf-table.py docs/perf.md
	set -o pipefail; S=$$(awk '/^alloc: go /{print $$3 / 5000}' target/sim-bench-pod.txt); \
	  cargo run --release -p dra-sim --bin sim-bench -- --nodes 5000 --cluster 5000 \
	  $${S:+--go-per-filter-s $$S} | python3 tools/perf-table.py docs/perf.md
	set -o pipefail; cargo test --release -p dra-sim --test differential -- --ignored \
	  cel_families_side_by_side --nocapture | python3 tools/perf-table.py docs/perf.md

## Our kubelet plugin side by side with dra-example-driver v0.4.0 on one real control plane,
## driven like the kubelet drives them (~6 min warm); method in docs/peers.md.
bench-peers:
	set -o pipefail; bash e2e/bench/peers.sh | python3 tools/perf-table.py docs/perf.md

## One node's slices on a real kube-apiserver (B200 x8, dynamic MIG): start -> all on a watch,
## bytes as stored and on a kubelet's / scheduler's watch, at idle and over a plugin restart.
bench-publish:
	set -o pipefail; bash e2e/bench/publish.sh | python3 tools/perf-table.py docs/perf.md

## The real kube-scheduler 1.37.2 placing pods with claims on Nodes carrying our slices (whole GPU,
## static MIG, dynamic MIG, on-demand MIG with the real plugins and controller); no kubelets.
## SCHED_NODES="100 1000" adds 1,000 nodes; method in docs/scheduler-bench.md.
bench-scheduler:
	set -o pipefail; bash e2e/bench/scheduler.sh | python3 tools/perf-table.py docs/perf.md

## Pod creation -> Running when a 3g.40gb must be created: on-demand MIG beside publish every
## placement, through stock kubelets (e2e/tests/bench_mig_latency.rs, release plugin and controller).
bench-mig-latency:
	nice cargo build --release -q -p dra-plugin -p dra-controller
	set -o pipefail; T="$${CARGO_TARGET_DIR:-$(CURDIR)/target}/release"; \
	  E2E_BENCH_MIG_LATENCY=1 E2E_TEST_TARGETS="--test bench_mig_latency" \
	  E2E_PLUGIN_BIN="$$T/dra-plugin" E2E_CONTROLLER_BIN="$$T/dra-controller" \
	  bash e2e/run.sh bench_mig_latency | python3 tools/perf-table.py docs/perf.md

## dra-controller at 1,000 API-only Nodes (500 in the migration pool) and 100 ComputeDomains: RSS,
## GPUCluster create/change -> reconciled, API requests per minute when idle; method in
## docs/controller-bench.md.
bench-controller:
	set -o pipefail; bash e2e/bench/controller.sh | python3 tools/perf-table.py docs/perf.md

## NVIDIA's own manifests (driver v0.5.0, from the Go module proxy) through the simulator.
nvidia-manifests:
	bash tools/nvidia-manifests.sh

## What a simulated node publishes.
slices:
	cargo run -q -p dra-plugin -- slices --backend simulated --profile h100-80gb:8 --node-name node-1 --feature-gates DynamicMIG=true -o yaml

.PHONY: image image-check image-check-dev

## The container image without a base image, daemon or registry: prints
## target/image/gpu-dra-driver-<tag>.oci.tar (an OCI layout as a tar; docs/image.md).
image:
	nice bash deploy/image/build.sh

## Builds the release image, unpacks it and runs both binaries inside it, NVML through mock-nvml/.
image-check:
	nice bash deploy/image/check.sh

## The same check on an image of the debug binaries e2e/run.sh builds: no second build in CI.
image-check-dev:
	IMAGE_PROFILE=dev bash deploy/image/check.sh
