// build/memtrade: one binary, many subcommands (see harness/cli/cli.cpp).
#include <unistd.h>
#include <cstdlib>

#include "harness/cli/cli.h"

int main(int argc, char** argv) {
  // OpenMP threads that spin between parallel regions (libgomp's default) starve each other as
  // soon as anything else runs on the machine: on 2 shared cores a gpt-tiny step went from
  // 7 ms to 84 ms. Passive waiting costs microseconds per region and is robust, so it is the
  // default unless the user chose a policy. libgomp reads it when it loads, before main, hence
  // the re-exec.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
  }
  return memtrade::cli_main(argc, argv);
}
