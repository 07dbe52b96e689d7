#!/usr/bin/env bash
# Nightly benchmark + regression gate. Runs the same on a GPU runner, a workstation or a laptop:
#
#   ci/nightly.sh [--build DIR] [--grid FILE] [--db FILE] [--out DIR] [--backend B] [--branch B]
#
# (each flag also as an environment variable: BUILD, GRID, DB, OUT, BACKEND, BRANCH; THRESHOLDS
# picks the thresholds file; ACCEPT_REGRESSION=1 records a deliberate regression as accepted.)
#
# Steps: build (unless BUILD points at an existing build) -> run the grid -> fetch the baseline
# (the newest run of BRANCH on this machine fingerprint from the history DB) -> compare (Markdown,
# JUnit and JSON) -> render the report -> add the run to the history -> change points of every
# point's series in the history (a regression starting within the last 2 runs fails) -> exit.
#
# Exit status: 0 no regression, 1 regression (or the run itself failed), 2 bad input / setup.
# Decision: the run is ALWAYS added to the history, marked with the gate's outcome (ok,
# regression, accepted, none). Trend charts must show the bad night too; but `history baseline`
# skips runs marked "regression", so tomorrow is still compared against the last good night and a
# regression keeps failing until it is fixed or accepted (ACCEPT_REGRESSION=1 on one run).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-}
GRID=${GRID:-$ROOT/ci/grids/nightly.toml}
DB=${DB:-history.db}
OUT=${OUT:-out/nightly}
BACKEND=${BACKEND:-auto}
BRANCH=${BRANCH:-${GITHUB_REF_NAME:-$(git -C "$ROOT" rev-parse --abbrev-ref HEAD 2>/dev/null || echo main)}}
THRESHOLDS=${THRESHOLDS:-$ROOT/ci/thresholds.toml}
ACCEPT_REGRESSION=${ACCEPT_REGRESSION:-0}

usage() { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --grid) GRID=$2; shift 2 ;;
    --db) DB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    --branch) BRANCH=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "nightly: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

log() { printf '[nightly] %s\n' "$*" >&2; }
[[ -f "$GRID" ]] || { log "grid $GRID not found"; exit 2; }
[[ -f "$THRESHOLDS" ]] || { log "thresholds $THRESHOLDS not found"; exit 2; }
mkdir -p "$OUT"

# ---- build ------------------------------------------------------------------------------------
if [[ -z "$BUILD" ]]; then
  BUILD=$ROOT/build-nightly
  cuda=OFF
  if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then cuda=ON; fi
  log "building $BUILD (MEMTRADE_CUDA=$cuda)"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMEMTRADE_CUDA=$cuda >&2
  cmake --build "$BUILD" -j "$(nproc)" --target memtrade >&2
fi
MEMTRADE=$BUILD/memtrade
[[ -x "$MEMTRADE" ]] || { log "no memtrade binary in $BUILD"; exit 2; }
"$MEMTRADE" --version >&2

# ---- run the grid -----------------------------------------------------------------------------
RESULTS=$OUT/results.json
run_rc=0
log "running $GRID on backend $BACKEND"
"$MEMTRADE" run --grid "$GRID" --backend "$BACKEND" --out "$RESULTS" || run_rc=$?
if [[ ! -s "$RESULTS" ]]; then
  log "memtrade run exited $run_rc and wrote no results"
  exit $(( run_rc == 2 ? 2 : 1 ))
fi
[[ $run_rc -eq 0 ]] || log "memtrade run exited $run_rc; comparing what it finished"

# ---- baseline and compare ---------------------------------------------------------------------
BASELINE=$OUT/baseline.json
gate=none
compare_rc=0
rm -f "$BASELINE"
base_rc=0
"$MEMTRADE" history baseline --db "$DB" --branch "$BRANCH" --like "$RESULTS" --out "$BASELINE" \
  || base_rc=$?
if [[ $base_rc -eq 0 ]]; then
  # A point of last night's run missing tonight fails the gate, unless the grid itself changed
  # (another grid hash: a committed, deliberate change), when removed points are only listed.
  grid_args=()
  if ! python3 - "$BASELINE" "$RESULTS" <<'PY'
import json, sys
a, b = (json.load(open(f)).get("meta", {}).get("grid_hash") for f in sys.argv[1:3])
sys.exit(0 if a == b else 1)
PY
  then
    log "the grid changed since the baseline: removed points are listed, not failed"
    grid_args=(--allow-removed)
  fi
  "$MEMTRADE" compare "$BASELINE" "$RESULTS" --thresholds "$THRESHOLDS" "${grid_args[@]}" \
    --format markdown --output "$OUT/compare.md" \
    --write-junit "$OUT/compare.xml" --write-json "$OUT/compare.json" || compare_rc=$?
  case $compare_rc in
    0) gate=ok ;;
    1) gate=regression ;;
    *) log "compare failed with exit $compare_rc (bad input)"; gate=none ;;
  esac
  if [[ $gate == regression && $ACCEPT_REGRESSION == 1 ]]; then
    log "regression accepted by ACCEPT_REGRESSION=1: this run becomes the new baseline"
    gate=accepted
  fi
elif [[ $base_rc -eq 1 ]]; then
  log "no baseline for branch $BRANCH on this machine yet: first run, nothing to compare"
  printf '## memtrade nightly\n\nNo baseline for branch `%s` on this machine yet: this run becomes the baseline.\n' \
    "$BRANCH" > "$OUT/compare.md"
  BASELINE=
else
  log "history baseline failed with exit $base_rc"
  exit 2
fi

# ---- report (charts) --------------------------------------------------------------------------
if "$MEMTRADE" --help 2>/dev/null | grep -qE '^[[:space:]]+report([[:space:]]|$)'; then
  report_args=("$RESULTS" --history "$DB" -o "$OUT/report")
  [[ -n "$BASELINE" ]] && report_args+=(--baseline "$BASELINE")
  "$MEMTRADE" report "${report_args[@]}" || log "warning: memtrade report failed; continuing"
else
  log "warning: this memtrade has no 'report' subcommand; no charts"
fi

# ---- history ----------------------------------------------------------------------------------
"$MEMTRADE" history add "$RESULTS" --db "$DB" --branch "$BRANCH" --gate "$gate"

# ---- change points over the history ----------------------------------------------------------
# Last night against tonight misses what creeps in over nights and what one noisy night hides;
# the series of every point does not (E-divisive means, docs/design.md "The gate over history").
# A regression that starts within the last 2 runs (the first night it can be confirmed) fails.
changes_rc=0
"$MEMTRADE" history changes --db "$DB" --branch "$BRANCH" > "$OUT/changes.txt" || changes_rc=$?
"$MEMTRADE" history changes --db "$DB" --branch "$BRANCH" --json > "$OUT/changes.json" || true
if [[ $changes_rc -eq 1 ]]; then
  printf '\n## Change points\n\n```\n%s\n```\n' "$(cat "$OUT/changes.txt")" >> "$OUT/compare.md"
elif [[ $changes_rc -ne 0 ]]; then
  log "history changes failed with exit $changes_rc"
fi

# ---- verdict ----------------------------------------------------------------------------------
[[ -f "$OUT/compare.md" ]] && cat "$OUT/compare.md" >&2
if [[ $compare_rc -ge 2 ]]; then exit 2; fi
if [[ $gate == regression ]]; then log "REGRESSION (see $OUT/compare.md)"; exit 1; fi
if [[ $changes_rc -eq 1 && $ACCEPT_REGRESSION != 1 ]]; then
  log "CHANGE POINT: a regression starts within the last 2 runs (see $OUT/changes.txt)"; exit 1
fi
if [[ $run_rc -ne 0 ]]; then exit 1; fi
log "ok"
