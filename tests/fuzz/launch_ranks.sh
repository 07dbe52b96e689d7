#!/bin/bash
# The fuzzer's rank launcher (MEMTRADE_LAUNCHER="bash tests/fuzz/launch_ranks.sh {n}"): mpirun
# for up to 2 ranks, as CI's machine has 2 cores. A generated --dp 64 would start 64 processes
# on them; it is refused here instead (exit 1: the point is an error row, a step exits 1), so
# the fuzzer judges the CLI's handling of it without paging the machine.
n=$1
shift
if [ "$n" -gt 2 ]; then
  echo "fuzz launcher: $n ranks is more than this test starts (2 at most)" >&2
  exit 1
fi
exec mpirun -np "$n" --oversubscribe --bind-to none "$@"
