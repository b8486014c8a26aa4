#!/bin/bash
# One GPU call, the newest work first (issue 31 items, then issue 30 items, zenoh_bench on
# the GPU host's CPUs if built into the folder, then the older suites), for a budget that
# may not cover run.sh: carry [".gl", ".gpu/DIR", "crates/testkit/gpu-machine/priority.sh"] and run
#   bash crates/testkit/gpu-machine/priority.sh DIR   (the log is $OUT/log.txt)
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
mkdir -p /tmp/nvrtc; ln -sf /usr/local/cuda/lib64/libnvrtc.so.13 /tmp/nvrtc/libnvrtc.so
export LD_LIBRARY_PATH=/tmp/nvrtc:/usr/local/cuda/lib64
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
B=./.gpu/$1; export TEGRA_INTEROP_PIPELINE=$PWD/$B/pipeline
G="--frames 2000 --width 1920 --height 1080 --format rgba8 --ring 4"
s() { echo; echo "== [$(date +%T)] $*"; }
{
s nvidia-smi; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s gpu_multicast; timeout 120 $B/gpu_multicast --include-ignored --test-threads 1 --nocapture 2>&1 | grep -vE "^test .* ok$" | tail -30
s multicast_processes; timeout 120 $B/multicast_processes --include-ignored --test-threads 1 2>&1 | grep -vE "^test .* ok$" | tail -30
s "pipeline gpu one process (zero-copy)"; timeout 60 $B/pipeline --backend gpu $G 2>&1 | tail -22
s "pipeline gpu --processes 2 (fd transport)"; timeout 90 $B/pipeline --processes 2 --backend gpu $G 2>&1 | tail -22
s "pipeline gpu --consumers"; timeout 90 $B/pipeline --backend gpu $G --consumers fifo,fifo,mailbox:slow=10 2>&1 | tail -12
s "pipeline gpu --consumers --consumer-processes"; timeout 120 $B/pipeline --backend gpu $G --consumers fifo,fifo,mailbox:slow=10 --consumer-processes 2>&1 | tail -14
s "multicast_bench gpu"; timeout 120 $B/multicast_bench --backend gpu --frames 1000 --json > $OUT/multicast_bench.json 2>$OUT/multicast_bench.err; echo "rc $?"; tail -c 2500 $OUT/multicast_bench.json; tail -5 $OUT/multicast_bench.err
for x in user_ptx user_chain user_cudarc; do for m in "" --copy; do s "$x $m"; timeout 60 $B/$x $m 2>&1 | tail -4; echo "rc $?"; done; done
s pipeline_vs_cuda; timeout 150 $B/pipeline_vs_cuda --backend gpu $G --quiet --json > $OUT/pipeline_vs_cuda.json 2>$OUT/pipeline_vs_cuda.err; echo "rc $?"; grep -E "^\|" $OUT/pipeline_vs_cuda.err | head -20; tail -c 1500 $OUT/pipeline_vs_cuda.json
[ -x $B/zenoh_bench ] && { s "zenoh_bench (simulator ring, this host's 16 cores)"; nproc; timeout 150 $B/zenoh_bench --frames 400 --rounds 3 --json > $OUT/zenoh_bench.json 2>$OUT/zenoh_bench.err; echo "rc $?"; tail -25 $OUT/zenoh_bench.err; tail -c 1500 $OUT/zenoh_bench.json; }
for t in gpu_conformance gpu_pipeline real_backend gpu_vulkan gpu_cudarc gpu_egl gpu_egl_stream; do s $t; timeout 120 $B/$t --include-ignored --test-threads 1 2>&1 | grep -vE "^test .* ok$" | tail -12; done
s "pipeline egl"; timeout 60 $B/pipeline --backend egl $G --quiet 2>&1 | tail -6
s "pipeline gpu copy"; timeout 60 $B/pipeline --backend gpu $G --copy --quiet 2>&1 | tail -6
s end
} > $OUT/log.txt 2>&1
