#!/usr/bin/env bash
# ci/cpu-gate.sh's verdicts on results it is handed (RESULTS=..., no grid run): the committed
# baseline against itself passes (0); a head that lost one point fails (1) and names it; a head
# with no points, or with every id renamed, is "nothing to judge" (2).
#   tests/ci/test_cpu_gate.sh BUILD_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:?usage: test_cpu_gate.sh BUILD_DIR}" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
BASE=$ROOT/ci/baselines/cpu-smoke.json
PY=/usr/bin/python3

gate() {  # gate HEAD_FILE -> exit code; output in $TMP/log
  local rc=0
  OUT="$TMP/out" RESULTS="$1" bash "$ROOT/ci/cpu-gate.sh" "$BUILD" > "$TMP/log" 2>&1 || rc=$?
  echo $rc
}
expect() {  # expect WHAT WANT GOT
  if [[ "$2" != "$3" ]]; then echo "FAIL: $1: exit $3, expected $2"; cat "$TMP/log"; exit 1; fi
}

expect "identical" 0 "$(gate "$BASE")"

dropped=$($PY - "$BASE" "$TMP/missing.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
gone = doc["points"].pop(3)["id"]
json.dump(doc, open(sys.argv[2], "w"))
print(gone)
PY
)
expect "one point missing" 1 "$(gate "$TMP/missing.json")"
grep -qF "missing       $dropped" "$TMP/log" || { echo "FAIL: $dropped not named"; cat "$TMP/log"; exit 1; }
grep -qF "refresh the baseline" "$TMP/log" || { echo "FAIL: no refresh hint"; cat "$TMP/log"; exit 1; }

$PY - "$BASE" "$TMP/empty.json" "$TMP/renamed.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
empty = dict(doc, points=[])
json.dump(empty, open(sys.argv[2], "w"))
for p in doc["points"]:
    p["id"] += "/renamed"
json.dump(doc, open(sys.argv[3], "w"))
PY
expect "empty head" 2 "$(gate "$TMP/empty.json")"
grep -q "nothing to judge" "$TMP/log" || { echo "FAIL: no 'nothing to judge'"; cat "$TMP/log"; exit 1; }
expect "every id renamed" 2 "$(gate "$TMP/renamed.json")"
echo "cpu-gate verdicts: ok"
