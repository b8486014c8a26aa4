#!/bin/bash
# Copy-mode probe (issue 24 item 8): pinned CUDA memory against the host memory the Vulkan
# producer can hand over (imported host-cached / write-combined Vulkan memory, the Vulkan
# mapping registered with cuMemHostRegister, host memory imported into Vulkan with
# VK_EXT_external_memory_host). See crates/testkit/examples/copy_probe.rs for the figures.
#
# Build here (from the checkout's root; DIR e.g. copyprobe):
#   cargo build --release -p tegra-interop-testkit --features vulkan --example copy_probe
#   mkdir -p .gpu/DIR && cp target/release/examples/copy_probe crates/testkit/gpu-machine/copy_probe.sh .gpu/DIR/ && strip .gpu/DIR/copy_probe
# Then on the GPU machine (device tool, carry [".gl", ".gpu/DIR"]), from the repository root:
#   bash .gpu/DIR/copy_probe.sh DIR
# Environment: ROUNDS (copies per figure, default 200), RUNS (probe runs, default 2).
# Writes $OUT/copy_probe_<run>.json and $OUT/copy_probe_log.txt; prints the log's tail.
set -u
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
B=./.gpu/$1
L=$OUT/copy_probe_log.txt
{
echo "== machine"; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv; nproc
for r in $(seq 1 "${RUNS:-2}"); do
  echo "== copy_probe run $r"
  timeout 240 "$B/copy_probe" --rounds "${ROUNDS:-200}" --json "$OUT/copy_probe_$r.json" 2>&1
  echo "rc $?"
done
} > "$L" 2>&1
tail -c 11800 "$L"
