#!/bin/bash
# Runs a memtrade grid on a Slurm cluster: an array of N shards, then a merge job.
#
#   ci/slurm/submit.sh GRID N OUTDIR [SHARDS]
#
#   GRID    the grid file (TOML)
#   N       number of shards: array tasks 0..N-1, task i runs `memtrade run --shard i/N`
#   OUTDIR  a directory every node can write (created): shard-<i>.json, slurm-<job>_<i>.out,
#           merged.json and merge.log
#   SHARDS  optional: resubmit only these shards of the N, e.g. "2" or "1,5" (the shard files
#           already there are resumed, the others are untouched), then merge again; with the
#           MEMTRADE_ARGS of the first submission (--resume refuses other --steps, --warmup or
#           --capacity)
#
# Environment: MEMTRADE (the binary; default build/memtrade of this repository), BACKEND,
# MEMTRADE_ARGS (extra `memtrade run` arguments, e.g. "--steps 50"), SBATCH_ARGS (extra sbatch
# options for both jobs, e.g. "--partition=gpu --gres=gpu:1 --time=02:00:00"); sbatch's own
# SBATCH_* input variables work too.
# Prints the two job ids:   grid job: <id>   /   merge job: <id>
set -euo pipefail

usage() { echo "usage: $0 GRID N OUTDIR [SHARDS]   (e.g. $0 ci/grids/docs.toml 8 /shared/out/docs)" >&2; exit 2; }
[ $# -ge 3 ] && [ $# -le 4 ] || usage
grid=$1 n=$2 outdir=$3 only=${4:-}
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "submit.sh: N must be a positive integer, got '$n'" >&2; exit 2; }
[ -f "$grid" ] || { echo "submit.sh: no grid file $grid" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
memtrade=${MEMTRADE:-$repo/build/memtrade}
[ -x "$memtrade" ] || { echo "submit.sh: $memtrade is not an executable (set MEMTRADE)" >&2; exit 2; }
# The jobs may start in another directory (or on another node): absolute paths only.
memtrade=$(realpath "$memtrade")
grid=$(realpath "$grid")
mkdir -p "$outdir"
outdir=$(realpath "$outdir")

array="0-$((n - 1))"
if [ -n "$only" ]; then
  [[ $only =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "submit.sh: SHARDS must be like 2 or 1,5, got '$only'" >&2; exit 2; }
  for i in ${only//,/ }; do
    [ "$i" -lt "$n" ] || { echo "submit.sh: shard $i is not one of 0..$((n - 1))" >&2; exit 2; }
  done
  array=$only
fi

# Everything the job scripts read goes through --export (ALL keeps PATH, LD_LIBRARY_PATH, ...).
# SHARDS=N always: a partial array (--array=2) has SLURM_ARRAY_TASK_COUNT=1.
export MEMTRADE=$memtrade GRID=$grid OUTDIR=$outdir SHARDS=$n
export BACKEND=${BACKEND:-} MEMTRADE_ARGS=${MEMTRADE_ARGS:-}
# shellcheck disable=SC2206  # SBATCH_ARGS is a list of words by design
extra=(${SBATCH_ARGS:-})

jobid=$(sbatch --parsable "${extra[@]}" --export=ALL --array="$array" \
  --output="$outdir/slurm-%A_%a.out" "$here/grid.sbatch")
jobid=${jobid%%;*}  # --parsable prints "id" or "id;cluster"
mergeid=$(sbatch --parsable "${extra[@]}" --export=ALL --dependency="afterany:$jobid" \
  --kill-on-invalid-dep=no --output="$outdir/slurm-merge-%j.out" "$here/merge.sbatch")
mergeid=${mergeid%%;*}
echo "grid job: $jobid (array $array of $n shards, results in $outdir)"
echo "merge job: $mergeid (after the array; log: $outdir/merge.log)"
