#!/usr/bin/env bash
# GPU check: everything CUDA in one short run (< 8 minutes on one H100/H200).
#
#   ci/gpu-check.sh [BUILD_DIR | BUNDLE_DIR]
#
# BUNDLE_DIR is what ci/device-bundle.sh makes (bin/, lib/, env.sh): prebuilt executables for a
# machine without our C++ dependencies; the GPU tests then run as 4 gtest shards instead of
# ctest. Through the device tool: build the bundle here, then
#   run(command="ci/gpu-check.sh device-bundle", carry=["device-bundle"])
#
# Without BUILD_DIR, configures and builds build-gpu (-DMEMTRADE_CUDA=ON; targets memtrade,
# memtrade_gpu_tests (the CUDA trainer tests included), bench_cuda). Steps, each timed and logged to
# $OUT/gpu-check.log (OUT defaults to out/gpu-check):
#   devices   memtrade --version and devices (plus read-only nvidia-smi facts)
#   ctest     ctest -L gpu in the build dir           -> $OUT/ctest-gpu.log (pass/fail/skip counts)
#   grid      ci/grids/gpu-check.toml on CUDA         -> $OUT/results.json
#   bench     bench_cuda GEMM + attention             -> $OUT/bench.json
#   torch     the PyTorch eager peer on the same points (when torch sees a GPU)
#             -> $OUT/torch.json, $OUT/vs-torch.md (memtrade compare; exit 1 = differences, fine)
#   report    memtrade report                         -> $OUT/report/
# then one summary table. A failing step is recorded and the next one runs anyway; the exit
# status is 1 when any step failed, else 0. GPU clocks and settings are never touched.
# Environment: OUT, PYTHON (python3), CTEST_JOBS (4), and per-step time limits in seconds
# CTEST_TIMEOUT (240), GRID_TIMEOUT (300), BENCH_TIMEOUT (150), TORCH_TIMEOUT (300).
set -uo pipefail  # no -e: every step records its own failure and the script goes on

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-out/gpu-check}
PYTHON=${PYTHON:-python3}
CTEST_JOBS=${CTEST_JOBS:-4}
GRID=$ROOT/ci/grids/gpu-check.toml
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu-check.log
: >"$LOG"

FAILED=()
STEPS=()
T0=$(date +%s)

log() { printf '[gpu-check] %s\n' "$*" | tee -a "$LOG" >&2; }

# run_step NAME FUNCTION [ARGS...]: runs FUNCTION with its output into the log (and stderr),
# records its wall time and outcome. FUNCTION returns 0 ok, 77 skipped, anything else failed.
run_step() {
  local name=$1 rc start end secs status
  shift
  log "---- $name"
  start=$(date +%s.%N)
  "$@" 2>&1 | tee -a "$LOG" >&2
  rc=${PIPESTATUS[0]}
  end=$(date +%s.%N)
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) status=ok ;;
    77) status=skipped ;;
    *) status="FAILED (exit $rc)"; FAILED+=("$name") ;;
  esac
  STEPS+=("$(printf '%-8s %-18s %7ss' "$name" "$status" "$secs")")
  log "$name: $status in ${secs}s"
}

# ---- build --------------------------------------------------------------------------------
BUNDLE=
if [[ $# -ge 1 && -f $1/env.sh && -x $1/bin/memtrade ]]; then
  BUNDLE=$(cd "$1" && pwd)
  # shellcheck source=/dev/null
  source "$BUNDLE/env.sh"
  # Built elsewhere: the reports package is in this checkout, drawn by this machine's python.
  export MEMTRADE_ROOT=$ROOT MEMTRADE_PYTHON=${MEMTRADE_PYTHON:-$(command -v "$PYTHON")}
  log "bundle $BUNDLE; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
elif [[ $# -ge 1 ]]; then
  BUILD=$(cd "$1" 2>/dev/null && pwd) || { log "build dir $1 not found"; exit 2; }
else
  BUILD=$ROOT/build-gpu
  do_build() {
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMEMTRADE_CUDA=ON || return 1
    local targets=(memtrade memtrade_gpu_tests bench_cuda) t rc=0
    if ! cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"; then
      # Build what builds, so that the steps which need only some of it still run.
      rc=1
      for t in "${targets[@]}"; do
        cmake --build "$BUILD" -j "$(nproc)" --target "$t" || log "target $t failed to build"
      done
    fi
    return $rc
  }
  run_step build do_build
fi
if [[ -n $BUNDLE ]]; then
  MEMTRADE=$BUNDLE/bin/memtrade
  BENCH=$BUNDLE/bin/bench_cuda
else
  MEMTRADE=$BUILD/memtrade
  BENCH=$BUILD/bench/bench_cuda
fi

need_memtrade() {
  [[ -x $MEMTRADE ]] || { echo "no memtrade binary at $MEMTRADE"; return 1; }
}

# ---- devices ------------------------------------------------------------------------------
do_devices() {
  need_memtrade || return 1
  "$MEMTRADE" --version
  if command -v nvidia-smi >/dev/null 2>&1; then  # read-only queries
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
      --format=csv || true
  fi
  "$MEMTRADE" devices || return 1
  "$MEMTRADE" devices | grep -qE '^cuda[[:space:]]+usable' || { echo "no CUDA device usable by memtrade"; return 1; }
}
run_step devices do_devices

# ---- ctest -L gpu -------------------------------------------------------------------------
do_ctest() {
  local clog=$OUT/ctest-gpu.log rc passed failed skipped
  (cd "$BUILD" && timeout "${CTEST_TIMEOUT:-240}" ctest -L gpu --output-on-failure \
    -j "$CTEST_JOBS" --timeout 120) >"$clog" 2>&1
  rc=$?
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$clog")
  failed=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run)' "$clog")
  skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$clog")
  tail -n 15 "$clog"
  echo "ctest -L gpu: $passed passed, $failed failed, $skipped skipped (exit $rc; $clog)"
  echo "$passed $failed $skipped" >"$OUT/ctest-counts.txt"
  [[ $rc -eq 0 ]] || return 1
  # Every test skipped means no device: not a pass.
  if [[ $passed -eq 0 ]]; then echo "no GPU test ran (no CUDA device?)"; return 1; fi
}
# The bundle has no CTest files: the test binary itself, in CTEST_JOBS shards at once.
do_gtest() {
  local exe=$BUNDLE/bin/memtrade_gpu_tests clog=$OUT/ctest-gpu.log i pids=() rc=0 passed=0 \
    failed=0 skipped=0 n
  [[ -x $exe ]] || { echo "no memtrade_gpu_tests at $exe"; return 1; }
  for ((i = 0; i < CTEST_JOBS; i++)); do
    GTEST_TOTAL_SHARDS=$CTEST_JOBS GTEST_SHARD_INDEX=$i OMP_WAIT_POLICY=passive \
      timeout "${CTEST_TIMEOUT:-240}" "$exe" >"$OUT/gtest-shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
  cat "$OUT"/gtest-shard*.log >"$clog"
  for f in "$OUT"/gtest-shard*.log; do
    n=$(sed -nE 's/^\[  PASSED  \] ([0-9]+) tests?\..*/\1/p' "$f"); passed=$((passed + ${n:-0}))
    n=$(sed -nE 's/^\[  FAILED  \] ([0-9]+) tests?, listed below.*/\1/p' "$f"); failed=$((failed + ${n:-0}))
    n=$(sed -nE 's/^\[  SKIPPED \] ([0-9]+) tests?, listed below.*/\1/p' "$f"); skipped=$((skipped + ${n:-0}))
  done
  grep -E '^\[  FAILED  \] [A-Za-z]' "$clog" | sort -u | head -n 40
  echo "gtest shards: $passed passed, $failed failed, $skipped skipped (exit $rc; $clog)"
  echo "$passed $failed $skipped" >"$OUT/ctest-counts.txt"
  [[ $rc -eq 0 && $failed -eq 0 ]] || return 1
  if [[ $passed -eq 0 ]]; then echo "no GPU test ran (no CUDA device?)"; return 1; fi
}
if [[ -n $BUNDLE ]]; then run_step gtest do_gtest; else run_step ctest do_ctest; fi

# ---- the grid -----------------------------------------------------------------------------
do_grid() {
  need_memtrade || return 1
  rm -f "$OUT/results.json"
  timeout "${GRID_TIMEOUT:-300}" "$MEMTRADE" run --grid "$GRID" --backend cuda \
    --out "$OUT/results.json"
}
run_step grid do_grid

# ---- microbenchmarks ----------------------------------------------------------------------
do_bench() {
  [[ -x $BENCH ]] || { echo "no bench_cuda at $BENCH"; return 1; }
  rm -f "$OUT/bench.json"
  # Benchmarks BM_Gemm (fp32, tf32, fp16, bf16 x 1024, 4096) and BM_Attention (B 4, 8 x fp32,
  # bf16) of bench/bench_cuda.cpp; JSON to the file, the readable table to the log.
  timeout "${BENCH_TIMEOUT:-150}" "$BENCH" --benchmark_filter='BM_Gemm|BM_Attention' \
    --benchmark_out="$OUT/bench.json" --benchmark_out_format=json || return 1
  # Without a device every row is a SkipWithError and the binary still exits 0.
  "$PYTHON" - "$OUT/bench.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1])).get("benchmarks", [])
ok = [b for b in rows if not b.get("error_occurred")]
if not ok:
    msg = rows[0].get("error_message", "") if rows else "no benchmark ran"
    sys.exit(f"bench_cuda: no benchmark ran ({msg})")
EOF
}
run_step bench do_bench

# ---- the PyTorch eager peer ---------------------------------------------------------------
do_torch() {
  if ! "$PYTHON" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    echo "PyTorch with CUDA not available to $PYTHON: peer skipped"
    return 77
  fi
  [[ -s $OUT/results.json ]] || { echo "no $OUT/results.json from the grid step"; return 1; }
  need_memtrade || return 1
  rm -f "$OUT/torch.json" "$OUT/vs-torch.md"
  local rc=0
  timeout "${TORCH_TIMEOUT:-300}" "$PYTHON" "$ROOT/bench/peers/torch_step.py" \
    --points "$OUT/results.json" --memtrade "$MEMTRADE" --device cuda --out "$OUT/torch.json" \
    || rc=$?
  [[ -s $OUT/torch.json ]] || { echo "torch_step wrote no results (exit $rc)"; return 1; }
  local crc=0
  "$MEMTRADE" compare "$OUT/torch.json" "$OUT/results.json" --format markdown \
    --output "$OUT/vs-torch.md" || crc=$?
  [[ $crc -le 1 ]] || { echo "memtrade compare failed (exit $crc)"; return 1; }
  return $rc
}
run_step torch do_torch

# ---- report -------------------------------------------------------------------------------
do_report() {
  need_memtrade || return 1
  [[ -s $OUT/results.json ]] || { echo "no $OUT/results.json: no report"; return 77; }
  "$MEMTRADE" report "$OUT/results.json" -o "$OUT/report"
}
run_step report do_report

# ---- summary ------------------------------------------------------------------------------
summary() {
  "$PYTHON" - "$OUT" <<'EOF'
import json, os, sys

out = sys.argv[1]


def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ms(p):
    t = (p or {}).get("time") or {}
    return t.get("median_s")


def peak(p):
    return ((p or {}).get("memory") or {}).get("peak_allocated")


def f(x, fmt, scale=1.0):
    return "-" if x is None else format(x * scale, fmt)


rows = []
bench = load("bench.json")
if bench:
    best = {}
    for b in bench.get("benchmarks", []):
        if b.get("error_occurred") or b.get("run_type") == "aggregate":
            continue
        name = b.get("run_name", b.get("name", ""))
        kind = name.split("/")[0].replace("BM_", "")
        key = f"{kind} {b.get('label', '?')}"
        if isinstance(b.get("TFLOPS"), (int, float)):
            best[key] = max(best.get(key, 0.0), b["TFLOPS"])
    order = {"fp32": 0, "tf32": 1, "fp16": 2, "bf16": 3}
    for key in sorted(best, key=lambda k: (not k.startswith("Gemm"), order.get(k.split()[-1], 9))):
        rows.append((f"{key} TFLOP/s (max over sizes)", f"{best[key]:.1f}"))
    if not best:
        rows.append(("GEMM TFLOP/s", "no successful benchmark in bench.json"))
else:
    rows.append(("GEMM TFLOP/s", "no bench.json"))

res, tor = load("results.json"), load("torch.json")
pts = {p["id"]: p for p in (res or {}).get("points", [])}
tpts = {p["id"]: p for p in (tor or {}).get("points", [])}
base = "gpt2-124m/b8/a1/bf16/ck0/adamw/off-none/zg-set_to_none/train/ec-never/in-pinned"
off = base.replace("off-none", "off-activations")
if res is None:
    rows.append(("gpt2-124m bf16 b8", "no results.json"))
elif base not in pts:
    rows.append(("gpt2-124m bf16 b8", "not in results.json"))
else:
    p = pts[base]
    tp = p.get("throughput") or {}
    rows.append(("gpt2-124m bf16 b8 status", p.get("status")))
    rows.append(("gpt2-124m bf16 b8 step ms", f(ms(p), ".2f", 1e3)))
    rows.append(("gpt2-124m bf16 b8 tokens/s", f(tp.get("tokens_per_s"), ",.0f")))
    rows.append(("gpt2-124m bf16 b8 MFU %", f(tp.get("mfu"), ".1f", 100)))
for label, src in (("memtrade", pts), ("torch", tpts)):
    a, b = ms(src.get(off)), ms(src.get(base))
    if a and b:
        rows.append((f"offload overlap ({label}): act-offload / none step time", f"{a / b:.2f}x"))
w = max(len(r[0]) for r in rows)
print()
print("=" * (w + 24))
for k, v in rows:
    print(f"{k:<{w}}  {v}")

common = [i for i in pts if i in tpts]
if common:
    print()
    print(f"{'point (memtrade vs torch eager)':<50} {'mt ms':>8} {'pt ms':>8} {'pt/mt':>6} "
          f"{'mt GiB':>7} {'pt GiB':>7}")
    for i in common:
        m, t = pts[i], tpts[i]
        parts = i.split("/")  # drop the knobs at their defaults
        short = "/".join(parts[:6] + [x for x in parts[6:] if x not in (
            "off-none", "zg-set_to_none", "train", "ec-never", "in-pinned")])
        mm, tm = ms(m), ms(t)
        ratio = f"{tm / mm:.2f}" if mm and tm else "-"
        st = "" if m.get("status") == t.get("status") == "ok" else \
            f"  [{m.get('status')} / {t.get('status')}]"
        print(f"{short:<50} {f(mm, '.2f', 1e3):>8} {f(tm, '.2f', 1e3):>8} {ratio:>6} "
              f"{f(peak(m), '.2f', 2**-30):>7} {f(peak(t), '.2f', 2**-30):>7}{st}")
elif res is not None:
    print("\n(no torch.json: no memtrade vs PyTorch rows)")
EOF
}
log "---- summary"
{
  summary || echo "(summary table failed: $PYTHON missing or a file unreadable)"
  echo
  echo "steps (total $(($(date +%s) - T0))s):"
  printf '  %s\n' "${STEPS[@]}"
  if [[ ${#FAILED[@]} -gt 0 ]]; then echo "FAILED: ${FAILED[*]}"; else echo "all steps passed"; fi
  echo "outputs: $OUT"
} 2>&1 | tee -a "$LOG"
[[ ${#FAILED[@]} -eq 0 ]]
