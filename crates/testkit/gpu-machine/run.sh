#!/bin/bash
# On the GPU machine (device tool, carry [".gl", ".gpu/DIR"]), from the repository root:
#   BENCH=1 bash crates/testkit/gpu-machine/run.sh DIR
# .gl holds the Vulkan/EGL loader packages (BENCHMARKS.md, "Reproducing").
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
mkdir -p /tmp/nvrtc; ln -sf /usr/local/cuda/lib64/libnvrtc.so.13 /tmp/nvrtc/libnvrtc.so
export LD_LIBRARY_PATH=/tmp/nvrtc:/usr/local/cuda/lib64
B=./.gpu/$1
L=$OUT/log.txt
{
echo "== nvidia-smi"; nvidia-smi --query-gpu=name,driver_version --format=csv
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
for t in gpu_conformance gpu_vulkan gpu_cudarc gpu_egl gpu_egl_stream gpu_pipeline gpu_multicast real_backend ${EXTRA:-}; do
  echo "== $t"; $B/$t --include-ignored --test-threads 1 2>&1 | grep -vE "^test .* ok$" | tail -40
done
echo "== interop_info"; $B/interop_info 2>&1 | grep -E "DMABUF|dma-buf|auto picks|gpu  "
P="$B/pipeline --backend gpu --frames 2000 --width 1920 --height 1080 --format rgba8 --ring 4 --quiet"
echo "== pipeline gpu zero-copy"; $P 2>&1 | tail -18
echo "== pipeline gpu copy"; $P --copy 2>&1 | tail -18
for r in ${RINGS:-}; do echo "== pipeline gpu zero-copy ring $r"; $P --ring $r 2>&1 | grep -E "verified|stages|camera  |verify  |handover  |consumer  |transport:|throughput"; done
E="$B/pipeline --backend egl --frames 2000 --width 1920 --height 1080 --format rgba8 --ring 4 --quiet"
echo "== pipeline egl"; $E 2>&1 | tail -19
echo "== pipeline egl json"; $E --json 2>&1 | tail -3 > $OUT/pipeline_egl.json; head -c 300 $OUT/pipeline_egl.json; echo
echo "== pipeline_vs_cuda"; $B/pipeline_vs_cuda --backend gpu --frames 2000 --width 1920 --height 1080 --format rgba8 --ring 4 --quiet > $OUT/pipeline_vs_cuda.txt 2>&1; echo "rc $?"; cat $OUT/pipeline_vs_cuda.txt | grep -vE "^  \(|^pipeline:|^backend"
for x in user_ptx user_chain user_cudarc; do for m in "" --copy; do echo "== $x $m"; timeout 120 $B/$x $m 2>&1 | tail -6; echo "rc $?"; done; done
echo "== pipeline_vs_cuda (second)"; $B/pipeline_vs_cuda --backend gpu --frames 2000 --width 1920 --height 1080 --format rgba8 --ring 4 --quiet --json > $OUT/pipeline_vs_cuda2.json 2>&1; echo "rc $?"; tail -c 1500 $OUT/pipeline_vs_cuda2.json
echo "== pipeline gpu json"; $P --json 2>&1 | tail -3 > $OUT/pipeline_gpu.json; head -c 600 $OUT/pipeline_gpu.json; echo
echo "== pipeline gpu multicast"; $P --consumers fifo,fifo,mailbox:slow=10 2>&1 | tail -7
echo "== multicast_bench gpu"; timeout 300 $B/multicast_bench --backend gpu --frames 1000 2>&1 | tail -9; echo "rc $?"
timeout 300 $B/multicast_bench --backend gpu --frames 1000 --json > $OUT/multicast_bench.json 2>&1; echo "rc $? (json)"
[ "${BENCH:-1}" = 1 ] && { echo "== gpu_bench"; timeout 240 $B/gpu_bench "$OUT/gpu_bench.md" --json "$OUT/gpu_bench.json" > /dev/null 2>&1; grep -E "^\| |Goals|Frame loop" $OUT/gpu_bench.md | head -30; }
} > $L 2>&1
tail -c 11500 $L
