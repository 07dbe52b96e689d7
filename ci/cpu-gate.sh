#!/usr/bin/env bash
# CPU regression gate for every commit: runs ci/grids/smoke.toml on the CPU backend and compares
# it with the committed baseline ci/baselines/cpu-smoke.json using ci/thresholds-cpu.toml (memory
# exact; time shown but not gated, since shared CI machines are too noisy for it).
#
#   ci/cpu-gate.sh [BUILD_DIR]          (default: build)
#
# Every point of the baseline must be in the run: a lost point, or a change that renames point
# ids, fails the gate (exit 1) until the baseline is refreshed on purpose. No matching point at
# all is exit 2 ("nothing to judge"). Exit: 0 pass, 1 regression or missing points, 2 bad input.
# Writes out/cpu-gate/{results.json,compare.md,compare.xml}.
#
# Environment (for tests and for judging a run you already have): RESULTS=FILE compares that
# results file instead of running the grid; BASELINE=FILE replaces the committed baseline.
#
# After a deliberate memory or grid change, refresh the baseline explicitly and commit it:
#   BUILD_DIR/memtrade run --grid ci/grids/smoke.toml --backend cpu --out ci/baselines/cpu-smoke.json
# (to check a rename first: memtrade compare OLD NEW --rename OLD_ID=NEW_ID or --rename-map FILE).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-${BUILD:-$ROOT/build}}
GRID=$ROOT/ci/grids/smoke.toml
BASELINE=${BASELINE:-$ROOT/ci/baselines/cpu-smoke.json}
THRESHOLDS=$ROOT/ci/thresholds-cpu.toml
OUT=${OUT:-$ROOT/out/cpu-gate}
MEMTRADE=$BUILD/memtrade
REFRESH="$MEMTRADE run --grid ci/grids/smoke.toml --backend cpu --out ci/baselines/cpu-smoke.json"

[[ -x "$MEMTRADE" ]] || { echo "cpu-gate: no memtrade binary in $BUILD" >&2; exit 2; }
[[ -f "$GRID" ]] || { echo "cpu-gate: $GRID not found" >&2; exit 2; }
if [[ ! -f "$BASELINE" ]]; then
  echo "cpu-gate: no baseline $BASELINE; create it with:" >&2
  echo "  $REFRESH" >&2
  exit 2
fi
mkdir -p "$OUT"
HEAD=${RESULTS:-$OUT/results.json}
if [[ -z "${RESULTS:-}" ]]; then
  "$MEMTRADE" run --grid "$GRID" --backend cpu --out "$HEAD"
fi
rc=0
"$MEMTRADE" compare "$BASELINE" "$HEAD" --thresholds "$THRESHOLDS" \
  --write-markdown "$OUT/compare.md" --write-junit "$OUT/compare.xml" || rc=$?
if [[ -n "${GITHUB_STEP_SUMMARY:-}" && -f "$OUT/compare.md" ]]; then
  cat "$OUT/compare.md" >> "$GITHUB_STEP_SUMMARY"
fi
if [[ $rc -ne 0 ]]; then
  echo "cpu-gate: FAILED (exit $rc). If the change is deliberate, refresh the baseline and commit it:" >&2
  echo "  $REFRESH" >&2
fi
exit $rc
