// build/memtrade: one binary, many subcommands (see harness/cli.cpp).
#include "harness/cli.h"

int main(int argc, char** argv) { return memtrade::cli_main(argc, argv); }
