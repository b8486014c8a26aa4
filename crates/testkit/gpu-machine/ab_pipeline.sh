#!/bin/bash
# A/B of the discrete-GPU pipeline, old binaries against new, alternating in one run on one
# machine, with ours / limit for each mode.
#
# Build here (release, stripped; only what this script runs; optionally NEW's gpu_pipeline test
# binary, see below), e.g. for OLD = tag layout24 and NEW = this branch, from each checkout's root:
#   cargo build --release -p tegra-interop-pipeline --features vulkan --bin pipeline --bin pipeline_vs_cuda
#   mkdir -p .gpu/DIR && cp target/release/pipeline target/release/pipeline_vs_cuda .gpu/DIR/ && strip .gpu/DIR/*
# Then on the GPU machine (device tool, carry [".gl", ".gpu/OLD", ".gpu/NEW"]), from the
# repository root:
#   bash crates/testkit/gpu-machine/ab_pipeline.sh OLD NEW
# Environment: ROUNDS (default 3), FRAMES (default 2000), REPS (the limit's repetitions,
# default 100), PIPELINE_ARGS (more options for every pipeline run, e.g. "--readback inline"),
# COPY_FROM_AB=1 (in copy mode also run NEW with TEGRA_INTEROP_GPU_COPY_FROM=import, the earlier
# copy path of the same binary: side "newimport" in the summary), AHEAD_AB=1 (in both modes also
# run NEW with TEGRA_INTEROP_CAMERA_AHEAD=0, its serial producer loop: side "newserial"; an old
# binary ignores that variable).
#
# Per round, in this order: OLD zero-copy, NEW zero-copy, OLD copy, NEW copy (each `pipeline
# --backend gpu ... --json`), then NEW's pipeline_vs_cuda (the machine's limit for the same work,
# measured in that process, plus its own ours and plain-CUDA runs, all modes). The old binaries
# have no limit measurement: every round's rates are divided by that round's limit. Logs and JSON
# land in $OUT; the summary is the last thing printed.
set -u
OLD=./.gpu/$1
NEW=./.gpu/$2
ROUNDS=${ROUNDS:-3}
FRAMES=${FRAMES:-2000}
REPS=${REPS:-100}
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
mkdir -p /tmp/nvrtc; ln -sf /usr/local/cuda/lib64/libnvrtc.so.13 /tmp/nvrtc/libnvrtc.so
export LD_LIBRARY_PATH=/tmp/nvrtc:/usr/local/cuda/lib64
L=$OUT/ab_log.txt
A="--frames $FRAMES --width 1920 --height 1080 --format rgba8 --ring 4 --quiet"
{
echo "== machine"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
echo "== binaries"; ls -la "$OLD" "$NEW"
# NEW's transport tests first where carried (every frame verified in both modes and both copy
# paths: `cargo test --release -p tegra-interop-pipeline --features vulkan --test gpu_pipeline
# --no-run` gives the binary; copy it to .gpu/NEW/gpu_pipeline).
[ -x "$NEW/gpu_pipeline" ] && { echo "== gpu_pipeline (new)"; $NEW/gpu_pipeline --include-ignored --test-threads 1 2>&1 | grep -vE "^test .* ok$" | tail -20; }
for r in $(seq 1 "$ROUNDS"); do
  for m in zero-copy copy; do
    c=""; [ $m = copy ] && c="--copy"
    sides="old new"; [ $m = copy ] && [ "${COPY_FROM_AB:-0}" = 1 ] && sides="$sides newimport"
    [ "${AHEAD_AB:-0}" = 1 ] && sides="$sides newserial"
    for side in $sides; do
      B=$OLD; [ $side != old ] && B=$NEW
      CF=""; [ $side = newimport ] && CF="import"
      AH=""; [ $side = newserial ] && AH="0"
      J=$OUT/ab_${r}_${side}_${m}.json
      ${CF:+env TEGRA_INTEROP_GPU_COPY_FROM=$CF} ${AH:+env TEGRA_INTEROP_CAMERA_AHEAD=$AH} $B/pipeline --backend gpu $A $c ${PIPELINE_ARGS:-} --json > "$J" 2> "$OUT/ab_${r}_${side}_${m}.err"
      echo "round $r $side $m: rc $? $(grep -o '"frames_per_s": *[0-9.]*' "$J" | tail -1) $(grep -o '"passed": *[a-z]*' "$J" | head -1)"
    done
  done
  $NEW/pipeline_vs_cuda $A --limit-reps "$REPS" --json > "$OUT/ab_${r}_limit.json" 2> "$OUT/ab_${r}_limit.txt"
  echo "round $r pipeline_vs_cuda: rc $?"; grep -E "^limit pieces|^\||^warning" "$OUT/ab_${r}_limit.txt"
done
} > "$L" 2>&1
python3 - "$OUT" "$ROUNDS" >> "$L" 2>&1 <<'EOF'
import json, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def load(p):
    try:
        with open(p) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except Exception as e:
        return {"error": str(e)}
print("\n== summary (ours / limit per round; the limit measured in the same round by NEW's pipeline_vs_cuda)")
print("| round | mode | limit frames/s (bound by) | GPU bound frames/s | old frames/s | new frames/s | old / limit | new / limit | new / old |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
agg = {}
for r in range(1, rounds + 1):
    lim = load(f"{out}/ab_{r}_limit.json")
    rows = {m["mode"]: m for m in lim.get("modes", [])}
    for mode in ["zero-copy", "copy"]:
        l = (rows.get(mode) or {}).get("limit") or {}
        fps = {s: load(f"{out}/ab_{r}_{s}_{mode}.json").get("frames_per_s") for s in ["old", "new"]}
        lf = l.get("frames_per_s")
        ratio = lambda a, b: f"{a / b:.3f}" if a and b else "-"
        print(f"| {r} | {mode} | {lf or 0:.1f} ({l.get('bound_by', '-')}) | {l.get('gpu_frames_per_s') or 0:.1f} | "
              f"{fps['old'] or 0:.1f} | {fps['new'] or 0:.1f} | {ratio(fps['old'], lf)} | {ratio(fps['new'], lf)} | {ratio(fps['new'], fps['old'])} |")
        for s in ["old", "new"]:
            if fps[s] and lf:
                agg.setdefault((mode, s), []).append(fps[s] / lf)
        ni = load(f"{out}/ab_{r}_newimport_{mode}.json").get("frames_per_s")
        if ni and lf:
            agg.setdefault((mode, "newimport"), []).append(ni / lf)
            print(f"| {r} | {mode} (new, COPY_FROM=import) | {lf:.1f} | - | - | {ni:.1f} | - | {ni / lf:.3f} | - |")
        ns = load(f"{out}/ab_{r}_newserial_{mode}.json").get("frames_per_s")
        if ns and lf:
            agg.setdefault((mode, "newserial"), []).append(ns / lf)
            print(f"| {r} | {mode} (new, CAMERA_AHEAD=0) | {lf:.1f} | - | - | {ns:.1f} | - | {ns / lf:.3f} | - |")
print()
for (mode, s), v in sorted(agg.items()):
    print(f"{mode} {s}: ours / limit median {statistics.median(v):.3f} (min {min(v):.3f}, max {max(v):.3f}, {len(v)} rounds)")
EOF
tail -c 11800 "$L"
