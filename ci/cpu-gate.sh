#!/usr/bin/env bash
# CPU regression gate for every commit: runs ci/grids/smoke.toml on the CPU backend and compares
# it with the committed baseline ci/baselines/cpu-smoke.json using ci/thresholds-cpu.toml (memory
# exact; time shown but not gated, since shared CI machines are too noisy for it).
#
#   ci/cpu-gate.sh [BUILD_DIR]          (default: build)
#
# Exit: 0 pass, 1 regression, 2 bad input. Writes out/cpu-gate/{results.json,compare.md,
# compare.xml}. After a deliberate memory change, refresh the baseline:
#   BUILD_DIR/memtrade run --grid ci/grids/smoke.toml --backend cpu --out ci/baselines/cpu-smoke.json
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-${BUILD:-$ROOT/build}}
GRID=$ROOT/ci/grids/smoke.toml
BASELINE=$ROOT/ci/baselines/cpu-smoke.json
THRESHOLDS=$ROOT/ci/thresholds-cpu.toml
OUT=${OUT:-$ROOT/out/cpu-gate}
MEMTRADE=$BUILD/memtrade

[[ -x "$MEMTRADE" ]] || { echo "cpu-gate: no memtrade binary in $BUILD" >&2; exit 2; }
[[ -f "$GRID" ]] || { echo "cpu-gate: $GRID not found" >&2; exit 2; }
mkdir -p "$OUT"
"$MEMTRADE" run --grid "$GRID" --backend cpu --out "$OUT/results.json"
if [[ ! -f "$BASELINE" ]]; then
  echo "cpu-gate: no committed baseline $BASELINE; create it with:" >&2
  echo "  $MEMTRADE run --grid ci/grids/smoke.toml --backend cpu --out ci/baselines/cpu-smoke.json" >&2
  exit 2
fi
rc=0
"$MEMTRADE" compare "$BASELINE" "$OUT/results.json" --thresholds "$THRESHOLDS" \
  --write-markdown "$OUT/compare.md" --write-junit "$OUT/compare.xml" || rc=$?
if [[ -n "${GITHUB_STEP_SUMMARY:-}" && -f "$OUT/compare.md" ]]; then
  cat "$OUT/compare.md" >> "$GITHUB_STEP_SUMMARY"
fi
exit $rc
