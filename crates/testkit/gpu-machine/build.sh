#!/bin/bash
# Builds the GPU-machine binaries into .gpu/$1 (release, stripped); run from the
# repository root: bash crates/testkit/gpu-machine/build.sh DIR. EXTRA_TESTS may hold
# one more `cargo test ... --no-run --message-format=json` command.
set -e
D=.gpu/$1; rm -rf $D; mkdir -p $D
exes() { python3 -c "
import sys,json
for l in sys.stdin:
    try: m=json.loads(l)
    except: continue
    if m.get('executable') and m.get('target',{}).get('kind')==['test']: print(m['target']['name'], m['executable'])
"; }
{ cargo test --release -p tegra-interop-testkit --features vulkan --test gpu_conformance --test gpu_vulkan --test gpu_cudarc --test gpu_egl --test gpu_egl_stream --no-run --message-format=json
  cargo test --release -p tegra-interop-pipeline --features vulkan --test gpu_pipeline --test gpu_multicast --no-run --message-format=json
  cargo test --release -p tegra-interop-driver --features cudarc --test real_backend --no-run --message-format=json; } 2>/dev/null | exes > /tmp/exes.txt
[ -n "$EXTRA_TESTS" ] && eval "$EXTRA_TESTS" 2>/dev/null | exes >> /tmp/exes.txt
while read n p; do cp "$p" $D/$n; done < /tmp/exes.txt
cargo build --release -p tegra-interop-pipeline --features vulkan --bin pipeline --bin interop_info --bin pipeline_vs_cuda --bin multicast_bench
cargo build --release -p tegra-interop-testkit --features vulkan --example gpu_bench
cargo build --release -p tegra-interop-pipeline --features vulkan --example user_ptx --example user_chain
cargo build --release -p tegra-interop-pipeline --features vulkan,cudarc --example user_cudarc
cp target/release/pipeline target/release/interop_info target/release/pipeline_vs_cuda target/release/multicast_bench $D/
cp target/release/examples/gpu_bench target/release/examples/user_ptx target/release/examples/user_chain target/release/examples/user_cudarc $D/
strip $D/*
ls -la $D
