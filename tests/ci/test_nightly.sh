#!/usr/bin/env bash
# ci/nightly.sh end to end on the CPU backend: a tiny grid, a temporary history DB, two nights.
# The first night has no baseline (a note, exit 0); the second has a planted memory regression
# (MEMTRADE_FAULT=bloat holds 1 MiB more in one point), so it must exit non-zero and name the
# regression in its Markdown.
#   tests/ci/test_nightly.sh BUILD_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:?usage: test_nightly.sh BUILD_DIR}" && pwd)
TMP=$(mktemp -d)
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$TMP"' EXIT

cat > "$TMP/grid.toml" <<'TOML'
name = "nightly-test"
[run]
backend = "cpu"
warmup = 1
steps = 6
[axes]
model = ["mlp-tiny"]
batch_size = [4, 8]
TOML

night() {  # night NAME [env...]
  local name=$1; shift
  env THRESHOLDS="$ROOT/ci/thresholds-cpu.toml" "$@" bash "$ROOT/ci/nightly.sh" --build "$BUILD" --grid "$TMP/grid.toml" --db "$TMP/history.db" \
    --out "$TMP/$name" --backend cpu --branch main > "$TMP/$name.log" 2>&1
}

night first || { echo "FAIL: first night exited $?"; cat "$TMP/first.log"; exit 1; }
rc=0
night second MEMTRADE_FAULT=bloat:/b8/ || rc=$?
if [[ $rc -ne 1 ]]; then
  echo "FAIL: the planted regression exited $rc, expected 1"; cat "$TMP/second.log"; exit 1
fi
md=$(cat "$TMP/second"/*.md)
if ! grep -q "mlp-tiny/b8/.*| peak_allocated |.*(+1.00 MiB)" <<<"$md"; then
  echo "FAIL: the Markdown does not name the regression:"; echo "$md"; exit 1
fi
if grep -q "mlp-tiny/b4/.*| peak_allocated |" <<<"$md"; then
  echo "FAIL: the untouched point was flagged:"; echo "$md"; exit 1
fi
runs=$("$BUILD/memtrade" history list --db "$TMP/history.db" | grep -c "nightly-test" || true)
[[ $runs -eq 2 ]] || { echo "FAIL: expected 2 runs in the history, found $runs"; exit 1; }
echo "nightly end to end: first night ok, planted +1 MiB regression caught (exit 1), 2 runs in history"
