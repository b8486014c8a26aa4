#!/bin/bash
# On the GPU machine (device tool, carry [".gl", ".gpu/DIR"]), from the repository root:
#   bash crates/testkit/gpu-machine/perf.sh DIR
# The main job's discrete-GPU path at 1920x1080 RGBA8, ring of 4, 2000 frames: read-back
# checks inline vs overlapped, with 8 and 4 threads per write/check (TEGRA_INTEROP_FRAME_THREADS),
# then pipeline_vs_cuda and gpu_bench. Everything in one process run each; one log.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
mkdir -p /tmp/nvrtc; ln -sf /usr/local/cuda/lib64/libnvrtc.so.13 /tmp/nvrtc/libnvrtc.so
export LD_LIBRARY_PATH=/tmp/nvrtc:/usr/local/cuda/lib64
B=./.gpu/$1
L=$OUT/perf_log.txt
{
echo "== nvidia-smi"; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node\(s\)"
echo "== gpu_pipeline"; $B/gpu_pipeline --include-ignored --test-threads 1 2>&1 | grep -vE "^test .* ok$" | tail -12
P="$B/pipeline --backend gpu --frames 2000 --width 1920 --height 1080 --format rgba8 --ring 4 --quiet"
for ho in ${HANDOVERS:-queue-then-host}; do for th in ${THREADS:-8 4}; do for rb in ${READBACKS:-inline overlap}; do for m in "" "--copy"; do
  echo "== pipeline handover=$ho threads=$th readback=$rb $m"
  TEGRA_INTEROP_GPU_HANDOVER=$ho TEGRA_INTEROP_FRAME_THREADS=$th $P --readback $rb $m 2>&1 | grep -E "verified|interop overhead|camera  |verify  |handover  |consumer  |transport:|throughput"
done; done; done; done
for th in ${VS_THREADS:-default}; do
  echo "== pipeline_vs_cuda threads=$th"
  ( [ "$th" = default ] || export TEGRA_INTEROP_FRAME_THREADS=$th
    $B/pipeline_vs_cuda --backend gpu --frames 2000 --width 1920 --height 1080 --format rgba8 --ring 4 --quiet ${VS_ARGS:-} > $OUT/pipeline_vs_cuda_$th.txt 2>&1; echo "rc $?" )
  grep -E "^\||plain CUDA|transport:" $OUT/pipeline_vs_cuda_$th.txt
done
echo "== gpu_bench"; timeout 300 $B/gpu_bench "$OUT/gpu_bench.md" > /dev/null 2>&1; echo "rc $?"; grep -E "^\| |Goals|Frame loop|Handover" $OUT/gpu_bench.md | grep -v "diagnosis" | head -30
} > $L 2>&1
tail -c 11800 $L
