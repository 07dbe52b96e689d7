// The files memtrade writes (results, CSV, traces, reports): checked before any work starts, and
// written so that a failure (a full disk, a read-only mount) never leaves half a file, a stray
// temporary, or a message that names a hidden temporary instead of the user's path.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace memtrade {

// A write that failed for a reason outside the user's input (ENOSPC, EIO, EDQUOT): exit 1. Its
// message names the file and the reason, and says the file was left as it was.
class WriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws BadInput (one line, naming `flag` and the path) unless `path` can be written as a file:
// it is not a folder; its parent folder exists or can be created (as the write would, so it is
// created now); a file can be created there (read-only mounts, permissions, a parent that is a
// file). An empty path (the output was not asked for) passes. Run before the first point, so
// that an output a run cannot write is found in a second, not after hours of measuring.
void check_output_file(std::string_view flag, const std::filesystem::path& path);
// The same for an output folder (report -o): it is a folder, or can be created, and writable.
void check_output_dir(std::string_view flag, const std::filesystem::path& dir);

// Writes `text` via a temporary file in the same folder (`.<name>.<pid>.tmp`), fsync and
// rename(2): readers see the old file or the new one, never half of one. On failure the
// temporary is removed, the old file is kept, and WriteError says why.
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// Removes the temporaries (`.<name>.<pid>.tmp`) that runs killed mid-write left beside `path`,
// where their process is gone.
void remove_stale_temporaries(const std::filesystem::path& path);

}  // namespace memtrade
