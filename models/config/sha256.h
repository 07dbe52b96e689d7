// SHA-256 (FIPS 180-4) of a byte string, as 64 lowercase hex digits: how a model config file is
// told apart from another with the same name (models/config/hf_config.h).
#pragma once

#include <string>
#include <string_view>

namespace memtrade {

std::string sha256_hex(std::string_view bytes);

}  // namespace memtrade
