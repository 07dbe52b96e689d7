// BadInput: the one error type for bad user input (unknown value, impossible combination,
// unreadable or malformed file). The CLI prints its message as one line on stderr and exits
// with code 2; everything else that throws is a bug or an environment failure (exit 1).
#pragma once

#include <stdexcept>

namespace memtrade {

class BadInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace memtrade
