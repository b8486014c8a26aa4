#!/usr/bin/env bash
# The firmware example under QEMU, as `.ci/run firmware` runs it (issue 33):
#
#   1. format, lint and host tests of the firmware's own workspace (the scenario
#      and the checker, whose tests include logs that must be refused);
#   2. release build for thumbv7em-none-eabihf; flash and RAM from the ELF
#      sections (arm-none-eabi-size), and a check that no allocator is linked
#      (arm-none-eabi-nm);
#   3. the firmware on QEMU's mps2-an386 board model (Cortex-M4 with FPU),
#      semihosting on, under a time limit; its defmt log decoded by defmt-print;
#      QEMU's exit status is the firmware's (0 only when its own checks pass);
#   4. the decoded log compared, line by line, with the same scenario computed on
#      the host (tegra-interop-firmware-check), and the stack high-water mark
#      held to a budget;
#   5. a deliberately wrong log (one fence value changed) must be refused by the
#      checker, so a comparison that cannot fail does not pass unnoticed.
#
# Needs: qemu-system-arm, binutils-arm-none-eabi (Debian), defmt-print
# (crates.io), the thumbv7em-none-eabihf target. Outputs: target/firmware-run/.
set -euo pipefail
cd "$(dirname "$0")"

TARGET=thumbv7em-none-eabihf
ELF=target/$TARGET/release/tegra-interop-firmware
OUT=target/firmware-run
# Budgets with room above what the firmware uses today (README.md, "Measured"):
# a change that grows it past them fails here, to be looked at and re-recorded.
FLASH_BUDGET=${FW_FLASH_BUDGET:-32768}
RAM_BUDGET=${FW_RAM_BUDGET:-1024}
STACK_BUDGET=${FW_STACK_BUDGET:-4096}
# QEMU runs the whole scenario in well under a second; a hang ends here.
QEMU_TIMEOUT=${FW_QEMU_TIMEOUT:-60}

x() {
  echo "+ $*"
  "$@"
}

for tool in qemu-system-arm defmt-print arm-none-eabi-size arm-none-eabi-nm; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (.ci/run's install step installs it)" >&2; exit 1; }
done
qemu-system-arm --version | sed -n 1p
defmt-print --version

# 1. The firmware's own workspace: format, lints (firmware for the target, the
#    scenario and the checker for the host), host tests.
x cargo fmt --all --check
x cargo clippy --locked --release --target "$TARGET" -- -D warnings
x cargo clippy --locked -p tegra-interop-firmware-scenario -p tegra-interop-firmware-check --all-targets -- -D warnings
x cargo test --locked -p tegra-interop-firmware-scenario -p tegra-interop-firmware-check

# 2. Build, sizes, no allocator.
x cargo build --locked --release --target "$TARGET"
x arm-none-eabi-size -A "$ELF"
x arm-none-eabi-size -B "$ELF"
read -r text data bss _ < <(arm-none-eabi-size -B "$ELF" | tail -n1)
flash=$((text + data))
ram=$((data + bss))
echo "firmware: flash $flash bytes (text $text + data $data), static RAM $ram bytes (data $data + bss $bss)"
[[ $flash -le $FLASH_BUDGET ]] || { echo "error: flash $flash bytes is above the budget of $FLASH_BUDGET" >&2; exit 1; }
[[ $ram -le $RAM_BUDGET ]] || { echo "error: static RAM $ram bytes is above the budget of $RAM_BUDGET" >&2; exit 1; }
alloc_syms=$(arm-none-eabi-nm "$ELF" | grep -E ' (__rust_alloc|__rust_dealloc|__rust_realloc|__rust_alloc_zeroed|__rg_alloc|__rdl_alloc|__rust_alloc_error_handler)$' || true)
[[ -z "$alloc_syms" ]] || { echo "error: an allocator is linked: $alloc_syms" >&2; exit 1; }
echo "firmware: no allocator linked (no __rust_alloc / __rg_alloc / __rdl_alloc symbol)"

# 3. Run under QEMU; the raw defmt frames come out on semihosting stdout.
rm -rf "$OUT"
mkdir -p "$OUT"
echo "+ timeout $QEMU_TIMEOUT qemu-system-arm -machine mps2-an386 -cpu cortex-m4 ... -kernel $ELF > $OUT/defmt.bin"
rc=0
timeout "$QEMU_TIMEOUT" qemu-system-arm -machine mps2-an386 -cpu cortex-m4 -nographic \
  -monitor none -serial none -semihosting-config enable=on,target=native \
  -kernel "$ELF" >"$OUT/defmt.bin" || rc=$?
echo "+ defmt-print -e $ELF --log-format '{L} {s}' < $OUT/defmt.bin > $OUT/log.txt"
defmt-print -e "$ELF" --log-format '{L} {s}' <"$OUT/defmt.bin" >"$OUT/log.txt"
cat "$OUT/log.txt"
if [[ $rc -eq 124 ]]; then
  echo "error: the firmware did not exit within ${QEMU_TIMEOUT}s under QEMU (hang)" >&2
  exit 1
elif [[ $rc -ne 0 ]]; then
  echo "error: the firmware exited with status $rc under QEMU (1: a check failed, 101: panic, 102: hard fault)" >&2
  exit 1
fi
echo "firmware: exited 0 under QEMU"

# 4. The log against the host's computation, and the stack budget.
x cargo run --locked -q -p tegra-interop-firmware-check -- "$OUT/log.txt" --max-stack "$STACK_BUDGET"

# 5. A wrong log must fail the comparison.
sed 's/fence 0x1,/fence 0x2,/' "$OUT/log.txt" >"$OUT/log-wrong.txt"
if cmp -s "$OUT/log.txt" "$OUT/log-wrong.txt"; then
  echo "error: the negative check found no 'fence 0x1,' line to change" >&2
  exit 1
fi
if cargo run --locked -q -p tegra-interop-firmware-check -- "$OUT/log-wrong.txt" 2>"$OUT/wrong.err"; then
  echo "error: the checker accepted a log with a wrong fence value" >&2
  exit 1
fi
echo "firmware: a log with one wrong fence value is refused: $(head -n1 "$OUT/wrong.err")"
