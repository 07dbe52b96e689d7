#include "harness/common/output_file.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/common/bad_input.h"
#include "harness/common/process.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace fs = std::filesystem;
namespace {

fs::path folder_of(const fs::path& path) {
  return path.has_parent_path() ? path.parent_path() : fs::path(".");
}

std::string shown(const fs::path& path) {
  return echo(path.string(), kEchoPathMax);
}

[[noreturn]] void refuse(std::string_view flag, const fs::path& path, std::string_view why) {
  throw BadInput(fmt::format("{}{}{}: cannot write there: {}", flag, flag.empty() ? "" : " ",
                             shown(path), why));
}

// Creates `dir` (and its parents) as the write would; BadInput naming the reason where it can't.
void make_folder(std::string_view flag, const fs::path& shown_path, const fs::path& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return;
  // The first ancestor that exists must be a folder: "a parent that is a file" is said so.
  for (fs::path p = dir; !p.empty() && p != p.root_path(); p = p.parent_path()) {
    const auto st = fs::status(p, ec);
    if (fs::exists(st)) {
      if (!fs::is_directory(st)) refuse(flag, shown_path, fmt::format("{} is a file", shown(p)));
      break;
    }
  }
  fs::create_directories(dir, ec);
  if (ec) refuse(flag, shown_path, ec.message());
}

// Creates and removes a file in `dir`: the one test that answers for permissions, read-only
// mounts and ACLs alike (access(2) does not know about read-only mounts on every system).
void probe_folder(std::string_view flag, const fs::path& shown_path, const fs::path& dir) {
  const fs::path probe = dir / fmt::format(".memtrade-probe.{}", getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return;  // ours from a moment ago (same pid): the folder is writable
    refuse(flag, shown_path, std::strerror(errno));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::system_error(n < 0 ? errno : EIO, std::generic_category());
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

void check_output_file(std::string_view flag, const fs::path& path) {
  if (path.empty()) return;
  std::error_code ec;
  if (fs::is_directory(path, ec)) refuse(flag, path, "it is a folder");
  const fs::path dir = folder_of(path);
  make_folder(flag, path, dir);
  probe_folder(flag, path, dir);
}

void check_output_dir(std::string_view flag, const fs::path& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) refuse(flag, dir, "it is a file");
  make_folder(flag, dir, dir);
  probe_folder(flag, dir, dir);
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  const fs::path dir = folder_of(path);
  std::error_code ec;
  fs::create_directories(dir, ec);  // a folder that cannot be made fails at open, with its reason
  const fs::path tmp = dir / fmt::format(".{}.{}.tmp", path.filename().string(), getpid());
  auto fail = [&](int err) {
    ::unlink(tmp.c_str());
    throw WriteError(fmt::format("cannot write {}: {}", shown(path), std::strerror(err)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(errno);
  try {
    write_all(fd, text);
  } catch (const std::system_error& e) {
    ::close(fd);
    fail(e.code().value());
  }
  // fsync: a results file renamed into place is whole after a crash of the machine too (ext4 and
  // XFS may otherwise show the new name with no data). One per point: nothing next to a step.
  if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
    const int err = errno;
    ::close(fd);
    fail(err);
  }
  if (::close(fd) != 0) fail(errno);  // NFS reports a full disk here
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(errno);
}

void remove_stale_temporaries(const fs::path& path) {
  const std::string prefix = fmt::format(".{}.", path.filename().string());
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder_of(path), ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(".tmp")) continue;
    if (names_a_dead_process(
            std::string_view(name).substr(prefix.size(), name.size() - prefix.size() - 4)))
      fs::remove(entry.path(), ec);
  }
}

}  // namespace memtrade
