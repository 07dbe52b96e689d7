// The MPI backend of Comm (kernels/comm.h): Open MPI on CPU tensors, one process per rank.
#include "kernels/comm.h"

#include <cstdlib>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#ifdef MEMTRADE_HAVE_MPI
#include <mpi.h>
#endif

namespace memtrade {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

int launched_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* r = std::getenv(v)) return std::atoi(r);
  return 0;
}

#ifdef MEMTRADE_HAVE_MPI

void abort_ranks(int code) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(fmt::format("MPI {}: {}", what, std::string(msg, len)));
}

bool g_started = false;

void ensure_started() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  // Funneled: only the main thread calls MPI (the ops' OpenMP threads never do).
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init");
  // Errors come back as codes (then exceptions), so that a rank can write what went wrong.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_started = true;
  std::atexit(finalize_mpi);
}

// 16-bit sums: each element through fp32, one rounding per addition (as NCCL adds per hop).
template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Store(Load(a[i]) + Load(b[i]));
}

MPI_Op sum_op(DType t) {
  static MPI_Op bf16 = MPI_OP_NULL, f16 = MPI_OP_NULL;
  switch (t) {
    case DType::F32:
    case DType::I32:
      return MPI_SUM;
    case DType::BF16:
      if (bf16 == MPI_OP_NULL)
        check(MPI_Op_create(&sum16<bf16_to_float, float_to_bf16>, 1, &bf16), "op_create");
      return bf16;
    case DType::F16:
      if (f16 == MPI_OP_NULL)
        check(MPI_Op_create(&sum16<f16_to_float, float_to_f16>, 1, &f16), "op_create");
      return f16;
  }
  return MPI_SUM;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::I32:
      return MPI_INT32_T;
    case DType::F16:
    case DType::BF16:
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

int as_int(std::int64_t n, const char* what) {
  if (n < 0 || n > 2147483647)
    throw std::runtime_error(fmt::format("MPI {}: {} elements exceed MPI's int counts", what, n));
  return static_cast<int>(n);
}

// MPI's counts and displacements (ints) of parts given as element counts.
struct Parts {
  std::vector<int> counts, displs;
  Parts(std::span<const std::int64_t> c, int size, const char* what) {
    if (static_cast<int>(c.size()) != size)
      throw std::invalid_argument(
          fmt::format("MPI {}: {} counts on {} ranks", what, c.size(), size));
    std::int64_t off = 0;
    for (std::int64_t n : c) {
      counts.push_back(as_int(n, what));
      displs.push_back(as_int(off, what));
      off += n;
    }
  }
};

class MpiComm final : public Comm {
 public:
  // The world, or a group split from it (owned: freed with this object).
  explicit MpiComm(MPI_Comm comm = MPI_COMM_NULL) {
    ensure_started();
    comm_ = comm == MPI_COMM_NULL ? MPI_COMM_WORLD : comm;
    owned_ = comm != MPI_COMM_NULL;
    check(MPI_Comm_rank(comm_, &rank_), "rank");
    check(MPI_Comm_size(comm_, &size_), "size");
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &sub), "comm_split");
    MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
    return std::make_unique<MpiComm>(sub);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommBackend backend() const override { return CommBackend::mpi; }
  std::string name() const override {
    return fmt::format("mpi ({}, {} ranks)", mpi_library_version(), size_);
  }

  void all_reduce(Tensor& t) override {
    check(MPI_Allreduce(MPI_IN_PLACE, t.data(), as_int(t.numel(), "all_reduce"),
                        mpi_type(t.dtype()), sum_op(t.dtype()), comm_),
          "all_reduce");
  }
  void reduce_scatter(const Tensor& full, Tensor& part,
                      std::span<const std::int64_t> counts) override {
    Parts p(counts, size_, "reduce_scatter");
    check(MPI_Reduce_scatter(full.data(), part.data(), p.counts.data(), mpi_type(full.dtype()),
                             sum_op(full.dtype()), comm_),
          "reduce_scatter");
  }
  void all_gather(const Tensor& part, Tensor& full, std::span<const std::int64_t> counts) override {
    Parts p(counts, size_, "all_gather");
    check(MPI_Allgatherv(part.data(), p.counts[static_cast<std::size_t>(rank_)],
                         mpi_type(part.dtype()), full.data(), p.counts.data(), p.displs.data(),
                         mpi_type(full.dtype()), comm_),
          "all_gather");
  }
  void all_gather_in_place(Tensor& full, std::span<const std::int64_t> counts) override {
    Parts p(counts, size_, "all_gather");
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, full.data(), p.counts.data(),
                         p.displs.data(), mpi_type(full.dtype()), comm_),
          "all_gather");
  }
  void broadcast(Tensor& t, int root) override {
    check(MPI_Bcast(t.data(), as_int(t.numel(), "broadcast"), mpi_type(t.dtype()), root, comm_),
          "broadcast");
  }
  void all_to_all(const Tensor& in, std::span<const std::int64_t> send, Tensor& out,
                  std::span<const std::int64_t> recv) override {
    Parts s(send, size_, "all_to_all"), r(recv, size_, "all_to_all");
    check(MPI_Alltoallv(in.data(), s.counts.data(), s.displs.data(), mpi_type(in.dtype()),
                        out.data(), r.counts.data(), r.displs.data(), mpi_type(out.dtype()), comm_),
          "all_to_all");
  }
  void barrier() override { check(MPI_Barrier(comm_), "barrier"); }
  // MPI_Iallreduce: Open MPI's nonblocking collectives move inside MPI calls (its libnbc
  // schedules), which progress() makes between blocks of backward.
  void start_all_reduce(Tensor& t) override {
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, t.data(), as_int(t.numel(), "all_reduce"),
                         mpi_type(t.dtype()), sum_op(t.dtype()), comm_, &r),
          "all_reduce (nonblocking)");
    started_.push_back(r);
  }
  void progress() override {
    if (started_.empty()) return;
    int done = 0;
    check(
        MPI_Testall(static_cast<int>(started_.size()), started_.data(), &done, MPI_STATUSES_IGNORE),
        "test");
  }
  void wait_started() override {
    if (started_.empty()) return;
    check(MPI_Waitall(static_cast<int>(started_.size()), started_.data(), MPI_STATUSES_IGNORE),
          "wait");
    started_.clear();
  }
  double all_reduce_sum(double v) override { return reduce_host(v, MPI_SUM); }
  double all_reduce_max(double v) override { return reduce_host(v, MPI_MAX); }
  std::vector<std::int64_t> all_gather_host(std::span<const std::int64_t> mine) override {
    std::vector<std::int64_t> out(mine.size() * static_cast<std::size_t>(size_));
    check(MPI_Allgather(mine.data(), as_int(static_cast<std::int64_t>(mine.size()), "all_gather"),
                        MPI_INT64_T, out.data(),
                        as_int(static_cast<std::int64_t>(mine.size()), "all_gather"), MPI_INT64_T,
                        comm_),
          "all_gather");
    return out;
  }

 private:
  double reduce_host(double v, MPI_Op op) {
    double out = 0;
    check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, op, comm_), "all_reduce");
    return out;
  }
  MPI_Comm comm_ = MPI_COMM_WORLD;
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> started_;  // start_all_reduce's, until wait_started
};

}  // namespace

bool mpi_built() {
  return true;
}

std::unique_ptr<Comm> make_mpi_comm() {
  return std::make_unique<MpiComm>();
}

void finalize_mpi() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (g_started && inited && !finalized) MPI_Finalize();
}

std::string mpi_library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, static_cast<std::size_t>(len));
  s = s.substr(0, s.find_first_of(",\n"));
  return s;
}

#else  // no MPI in this build

void abort_ranks(int code) {
  std::_Exit(code);
}

bool mpi_built() {
  return false;
}
std::unique_ptr<Comm> make_mpi_comm() {
  throw std::runtime_error(
      "data parallelism on the CPU needs MPI, and this memtrade was built without it "
      "(install libopenmpi-dev: ci/setup.sh, then rebuild)");
}
void finalize_mpi() {}
std::string mpi_library_version() {
  return "not built";
}

#endif

}  // namespace memtrade
