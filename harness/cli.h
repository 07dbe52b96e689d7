// The memtrade command line: one binary, one subcommand per job.
#pragma once

#include <stdexcept>
#include <string>

namespace memtrade {

// Bad input from the user (unknown value, impossible combination, unreadable file): the CLI
// prints its message as one line on stderr and exits with code 2.
class BadInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

int cli_main(int argc, char** argv);

}  // namespace memtrade
