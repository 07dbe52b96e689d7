#!/bin/bash
# End-to-end test of the Slurm scale-out (ci/slurm/): a private one-node Slurm cluster on this
# machine (munged, slurmctld, slurmd; config, key, sockets, ports, state and logs all in one temp
# dir — no system-wide Slurm or munge config or service is read or touched), then
#   1. tests/slurm/grid.toml as 4 array tasks through ci/slurm/submit.sh + the merge job: the
#      merged file holds exactly the points of a one-machine run, with identical memory figures,
#      and slurmd launched the 4 array tasks;
#   2. a slow variant: one task cancelled mid-run (scancel JOB_2) and another requeued mid-run
#      (scontrol requeue JOB_3, which must resume its own file); the merge names the missing
#      point and its shard; resubmitting only shard 2 (submit.sh GRID 4 OUTDIR 2) completes it.
#
#   tests/slurm/test_slurm.sh [path/to/memtrade]        (default: build/memtrade)
# Exit 0 pass, 1 fail, 77 skipped (Slurm/munge cannot be installed or the daemons cannot start).
# Installs the Debian packages slurmctld, slurmd, slurm-client and munge when missing (root).
# KEEP_TMP=1 keeps the temp dir for a look at the logs.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
memtrade=${1:-$repo/build/memtrade}
grid=$here/grid.toml
submit=$repo/ci/slurm/submit.sh
shards=4

say() { echo "test_slurm: $*"; }
fail() { echo "test_slurm: FAIL: $*" >&2; exit 1; }
skip() { echo "SKIPPED: $*"; exit 77; }

[ -x "$memtrade" ] || fail "no memtrade binary at $memtrade"
memtrade=$(realpath "$memtrade")
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3) || skip "no python3 to compare the results"

# ---- packages ---------------------------------------------------------------------------------
need=()
for b in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
  command -v "${b%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${b%%:*}" ] || need+=("${b#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || skip "Slurm packages missing (${need[*]}) and not root to install them"
  command -v apt-get >/dev/null || skip "Slurm packages missing (${need[*]}) and no apt-get"
  say "installing ${need[*]}"
  # Debian starts a package's services on install unless policy-rc.d says no: no system-wide
  # munged/slurmd may come up because of this test. A policy-rc.d already there is left alone.
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
  fi
  ok=0
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "${need[@]}"; } >/tmp/memtrade-slurm-apt.log 2>&1 && ok=1
  [ "$made_policy" -eq 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$ok" -eq 1 ] || skip "cannot install ${need[*]} (log: /tmp/memtrade-slurm-apt.log)"
fi
export PATH=$PATH:/usr/sbin:/sbin

# ---- the private cluster ------------------------------------------------------------------------
T=$(mktemp -d /tmp/memtrade-slurm.XXXXXX) || skip "cannot make a temp dir"
chmod 700 "$T"
pids=()  # daemons this script started, in start order
jobs_submitted=()

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ ${#jobs_submitted[@]} -gt 0 ] && [ -f "$T/slurm.conf" ]; then
    scancel "${jobs_submitted[@]}" >/dev/null 2>&1
    for _ in $(seq 20); do  # let slurmd end the job steps it started
      [ -z "$(squeue -h -t RUNNING,COMPLETING 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null; done
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    for _ in $(seq 40); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.25; done
    kill -9 "${pids[i]}" 2>/dev/null
    wait "${pids[i]}" 2>/dev/null
  done
  if [ "${KEEP_TMP:-0}" = 1 ]; then say "kept $T"; else rm -rf "$T"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

logtail() { for f in "$@"; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done; }

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

host=$(hostname -s)
cpus=$(nproc)
mem=$(free -m | awk '/^Mem:/ {print int($2 * 0.9)}')
ctld_port=$(free_port)
slurmd_port=$(free_port)
while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port); done
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/out1" "$T/out2"
chmod 700 "$T/munge"

# munge: own key, socket, pid, log and seed files.
sock=$T/munge/munge.socket.2
if command -v mungekey >/dev/null; then
  mungekey -c -k "$T/munge/munge.key" >/dev/null 2>&1
else
  dd if=/dev/urandom of="$T/munge/munge.key" bs=1 count=1024 status=none
fi
[ -s "$T/munge/munge.key" ] || skip "cannot make a munge key"
chmod 400 "$T/munge/munge.key"
munged --foreground --force --socket="$sock" --key-file="$T/munge/munge.key" \
  --pid-file="$T/munge/munged.pid" --log-file="$T/munge/munged.log" \
  --seed-file="$T/munge/munged.seed" >"$T/munge/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
munge -n -S "$sock" 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1 ||
  { logtail "$T/munge/munged.out" "$T/munge/munged.log"; skip "munged does not start (see above)"; }

cat >"$T/slurm.conf" <<EOF
# memtrade test cluster: one node, everything under $T
ClusterName=memtrade-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/slurmd-%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=3600
MaxArraySize=1001
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$T/slurm.conf
# Nothing from the caller's Slurm environment (we may run inside a Slurm job).
unset SLURM_JOB_ID SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID SBATCH_ARGS MEMTRADE_ARGS BACKEND SHARDS
for v in $(env | sed -n 's/^\(SBATCH_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

slurmctld -D -c -f "$SLURM_CONF" >"$T/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$host" >"$T/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 120); do  # 60 s
  state=$(sinfo -h -n "$host" -o %t 2>/dev/null)
  [ "$state" = idle ] && { up=1; break; }
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
  sleep 0.5
done
if [ "$up" -ne 1 ]; then
  logtail "$T/slurmctld.out" "$T/slurmctld.log" "$T/slurmd.out" "$T/slurmd.log"
  skip "the private Slurm cluster did not come up (node state '${state:-none}', see above)"
fi
say "cluster up: node $host, $cpus CPUs, slurmctld :$ctld_port, slurmd :$slurmd_port, dir $T"

# ---- helpers -----------------------------------------------------------------------------------
job_field() {  # job_field JOBID FIELD: FIELD=value from scontrol (first record)
  scontrol -o show job "$1" 2>/dev/null | head -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"
}
wait_done() {  # wait_done JOBID SECONDS: prints the final state
  local s
  for _ in $(seq $(($2 * 2))); do
    s=$(job_field "$1" JobState)
    case $s in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
      echo "$s"; return 0 ;; esac
    sleep 0.5
  done
  echo "TIMEOUT_WAITING(${s:-none})"
  return 1
}
submit() {  # submit ARGS...: runs submit.sh, sets grid_job and merge_job
  local out
  out=$(MEMTRADE=$memtrade "$submit" "$@" 2>&1) || fail "submit.sh $*: $out"
  echo "$out" | sed 's/^/  /'
  grid_job=$(echo "$out" | sed -n 's/^grid job: \([0-9]*\).*/\1/p')
  merge_job=$(echo "$out" | sed -n 's/^merge job: \([0-9]*\).*/\1/p')
  [ -n "$grid_job" ] && [ -n "$merge_job" ] || fail "submit.sh printed no job ids: $out"
  jobs_submitted+=("$grid_job" "$merge_job")
}
npoints() { "$py" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["points"]))' "$1" 2>/dev/null || echo 0; }
# compare MERGED SINGLE: same ids in the same order, each once, identical memory figures.
compare() {
  "$py" - "$1" "$2" <<'PY'
import json, sys
m, s = (json.load(open(p)) for p in sys.argv[1:3])
mi, si = [p["id"] for p in m["points"]], [p["id"] for p in s["points"]]
errs = []
if len(set(mi)) != len(mi): errs.append("duplicate points in the merged file")
if mi != si: errs.append(f"point ids differ: merged {mi} vs single {si}")
for a, b in zip(m["points"], s["points"]):
    for k in ("peak_allocated", "peak_reserved", "breakdown_at_peak"):
        if a["memory"].get(k) != b["memory"].get(k):
            errs.append(f"{a['id']}: memory.{k} {a['memory'].get(k)} vs {b['memory'].get(k)}")
    if a.get("status") != b.get("status"): errs.append(f"{a['id']}: status {a.get('status')} vs {b.get('status')}")
if errs: print("\n".join(errs)); sys.exit(1)
print(f"{len(mi)} points, ids in grid order, each once; peak_allocated, peak_reserved and "
      "breakdown_at_peak identical to the one-machine run")
PY
}

# ---- 1. four shards vs one machine -----------------------------------------------------------
say "case 1: $grid as $shards array tasks, merged, vs one machine"
t0=$(date +%s.%N)
"$memtrade" run --grid "$grid" --out "$T/single.json" --quiet || fail "one-machine run failed"
t1=$(date +%s.%N)
total=$(npoints "$T/single.json")
[ "$total" -ge "$shards" ] || fail "the one-machine run has $total points"
submit "$grid" "$shards" "$T/out1"
state=$(wait_done "$merge_job" 300) || fail "merge job $merge_job not done within 300 s ($state)"
t2=$(date +%s.%N)
[ "$state" = COMPLETED ] || { cat "$T/out1/merge.log" 2>/dev/null; fail "merge job $merge_job ended $state"; }
sed 's/^/  merge.log: /' "$T/out1/merge.log"
compare "$T/out1/merged.json" "$T/single.json" || fail "merged results differ from the one-machine run"
# Every array task ran, through slurmd: its state, its output file, and slurmd's log.
ids=()
while read -r line; do
  tid=$(echo "$line" | tr ' ' '\n' | sed -n 's/^ArrayTaskId=//p')
  jid=$(echo "$line" | tr ' ' '\n' | sed -n 's/^JobId=//p')
  st=$(echo "$line" | tr ' ' '\n' | sed -n 's/^JobState=//p')
  [ "$st" = COMPLETED ] || fail "array task ${grid_job}_$tid ended $st"
  grep -q "memtrade shard $tid/$shards" "$T/out1/slurm-${grid_job}_$tid.out" 2>/dev/null ||
    fail "no output of array task ${grid_job}_$tid"
  ids+=("$jid")
done < <(scontrol -o show job "$grid_job" | grep "ArrayJobId=$grid_job ")
[ ${#ids[@]} -eq "$shards" ] || fail "${#ids[@]} array tasks of job $grid_job, expected $shards"
launched=0
for jid in "${ids[@]}"; do
  l=$(grep -E "(Launching batch job|batch_job) $jid\b|JobId=$jid\b.*batch|StepId=$jid\.batch" "$T/slurmd.log" | head -n 1)
  [ -n "$l" ] && { launched=$((launched + 1)); echo "  slurmd.log: $l"; }
done
[ "$launched" -eq "$shards" ] || fail "slurmd.log shows $launched of $shards array tasks launched"
say "case 1 ok: one machine $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s, $shards shards on Slurm (submit to merged) $(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.1f", b-a}') s"

# ---- 2. a cancelled shard, a requeued shard, resubmission --------------------------------------
# Slow points (the grid's gpt-tiny points take seconds with many steps; the memory figures do not
# depend on the step count), so that tasks can be caught mid-run: each between its two points.
steps=${SLURM_TEST_STEPS:-1000}
say "case 2: $shards slow shards (--steps $steps); cancel shard 2 and requeue shard 3 mid-run"
out=$T/out2
MEMTRADE_ARGS="--steps $steps" submit "$grid" "$shards" "$out"
first_job=$grid_job first_merge=$merge_job
cancelled=0 requeued=0
for _ in $(seq 480); do  # 240 s
  if [ "$cancelled" -eq 0 ] && [ "$(npoints "$out/shard-2.json")" -ge 1 ]; then
    [ "$(npoints "$out/shard-2.json")" -lt 2 ] || fail "shard 2 finished before it could be cancelled (raise SLURM_TEST_STEPS)"
    scancel "${first_job}_2" || fail "scancel ${first_job}_2"
    cancelled=1
    say "cancelled ${first_job}_2 after 1 of its 2 points"
  fi
  if [ "$requeued" -eq 0 ] && [ "$(npoints "$out/shard-3.json")" -ge 1 ]; then
    [ "$(npoints "$out/shard-3.json")" -lt 2 ] || fail "shard 3 finished before it could be requeued (raise SLURM_TEST_STEPS)"
    cp "$out/shard-3.json" "$T/shard-3.before-requeue.json"
    scontrol requeue "${first_job}_3" || fail "scontrol requeue ${first_job}_3"
    requeued=1
    say "requeued ${first_job}_3 after 1 of its 2 points"
  fi
  [ "$cancelled" -eq 1 ] && [ "$requeued" -eq 1 ] && break
  s=$(job_field "$first_merge" JobState)
  [ "$s" = PENDING ] || [ "$s" = RUNNING ] || break
  sleep 0.5
done
[ "$cancelled" -eq 1 ] && [ "$requeued" -eq 1 ] || fail "could not catch shards 2 and 3 mid-run"
state=$(wait_done "$first_merge" 300) || fail "merge job $first_merge not done within 300 s ($state)"
cp "$out/merge.log" "$T/merge-after-cancel.log"
# The point that scancel interrupted is no result: it must not be in the shard file (else --resume
# skips it and merge counts it as done).
if grep -q 'crashed: Terminated' "$out/shard-2.json"; then
  grep -o '"error": *"crashed: Terminated[^"]*"' "$out/shard-2.json" | sed 's/^/  shard-2.json: /'
  fail "memtrade recorded the point that scancel interrupted as a result row (crashed: Terminated); \
the harness must treat a child killed by SIGTERM/SIGINT as an interruption, not a crash"
fi
sed 's/^/  merge.log: /' "$out/merge.log"
[ "$state" = FAILED ] || fail "merge job after a cancelled shard ended $state, expected FAILED"
grep -q "^missing [0-9]* points" "$out/merge.log" || fail "merge.log does not name missing points"
want=$("$memtrade" run --grid "$grid" --list | awk -v n="$shards" 'NR % n == 3' | tail -n 1)  # shard 2: points 2 and 6, its last
grep -qF "  $want  (shard 2/$shards)" "$out/merge.log" || fail "merge.log does not name $want of shard 2/$shards"
[ "$(grep -c '(shard ' "$out/merge.log")" -eq 1 ] || fail "merge.log names other missing points than shard 2's last"
# The requeued task ran again (restart 1) and resumed: its first point is the one from before.
t3=$(job_field "${first_job}_3" JobState)
[ "$t3" = COMPLETED ] || fail "requeued task ${first_job}_3 ended $t3"
grep -q "restart 1" "$out/slurm-${first_job}_3.out" || fail "task ${first_job}_3 shows no restart"
"$py" - "$T/shard-3.before-requeue.json" "$out/shard-3.json" <<'PY' || fail "the requeued shard 3 did not resume its file"
import json, sys
a, b = (json.load(open(p))["points"] for p in sys.argv[1:3])
assert len(b) == 2 and a[0] == b[0], "first point rerun or lost"
PY
say "requeued task ${first_job}_3 restarted and resumed its own file (point 1 kept, point 2 run)"

say "resubmitting shard 2 only"
before=$(npoints "$out/shard-2.json")
# With the run settings it started with: --resume refuses others (they would mix in one file).
MEMTRADE_ARGS="--steps $steps" submit "$grid" "$shards" "$out" 2
state=$(wait_done "$merge_job" 300) || fail "merge job $merge_job not done within 300 s ($state)"
sed 's/^/  merge.log: /' "$out/merge.log"
[ "$state" = COMPLETED ] || fail "merge job after the resubmission ended $state"
[ "$(job_field "$grid_job" ArrayTaskId)" = 2 ] || fail "resubmission did not run array index 2"
grep -q "memtrade shard 2/$shards" "$out/slurm-${grid_job}_2.out" || fail "the resubmitted task did not run shard 2/$shards"
[ "$before" -eq 1 ] && [ "$(npoints "$out/shard-2.json")" -eq 2 ] || fail "shard 2 did not resume ($before -> $(npoints "$out/shard-2.json") points)"
compare "$out/merged.json" "$T/single.json" || fail "merged results after resubmission differ from the one-machine run"
say "case 2 ok"

# ---- 3. a data-parallel point: srun starts its ranks -------------------------------------------
# memtrade run inside a Slurm job: a point with data_parallel 2 is started by srun (PMIx), not
# mpirun (harness/common/launch.h); each rank's measured peak equals its prediction.
say "case 3: a dp 2 grid inside a Slurm job: srun launches each point's 2 ranks"
printf '[run]\nwarmup = 1\nsteps = 2\n[axes]\nmodel = ["gpt-tiny"]\nbatch_size = [4]\n%s\n%s\n' \
  'data_parallel = [2]' 'sharding = ["none", "zero3"]' >"$T/dp.toml"
dp_job=$(sbatch --parsable -n 2 -o "$T/dp.out" \
  --wrap "'$memtrade' run --grid '$T/dp.toml' --backend cpu --out '$T/dp.json' --quiet") ||
  fail "sbatch of the dp job failed"
jobs_submitted+=("$dp_job")
state=$(wait_done "$dp_job" 240) || fail "dp job $dp_job not done within 240 s ($state)"
[ "$state" = COMPLETED ] || { cat "$T/dp.out"; fail "dp job $dp_job ended $state"; }
"$py" - "$T/dp.json" "$dp_job" <<'PY' || { cat "$T/dp.out"; fail "the dp points are not what srun's 2 ranks measured"; }
import json, sys
pts = json.load(open(sys.argv[1]))["points"]
assert len(pts) == 2, pts
for p in pts:
    assert p["status"] == "ok", p
    assert p.get("launcher", "").startswith(f"srun (job {sys.argv[2]}"), p.get("launcher")
    ranks = p["memory"]["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1], ranks
    assert all(r["peak_allocated"] == r["predicted_peak"] for r in ranks), ranks
    print(f"  {p['id']}: {p['launcher']}; per rank {[r['peak_allocated'] for r in ranks]} B, as predicted")
PY
say "case 3 ok"
say "PASS"
