// Comm's MPI backend on 2 real ranks (ctest runs this under mpirun -np 2): every collective,
// with uneven parts, on F32, BF16 and I32 CPU tensors, against what each rank can compute alone.
#include <gtest/gtest.h>

#include <numeric>

#include "kernels/comm.h"
#include "kernels/device.h"

namespace memtrade {
namespace {

struct Ranks : ::testing::Test {
  static Comm& comm() {
    static std::unique_ptr<Comm> c = make_mpi_comm();
    return *c;
  }
  std::unique_ptr<Device> dev = make_device("cpu", DeviceOptions{});
  Tensor make(std::int64_t n, DType t) { return dev->empty({n}, t, Category::temporaries); }
};

TEST_F(Ranks, TwoRanks) {
  ASSERT_EQ(comm().size(), 2) << "run under mpirun -np 2";
  EXPECT_EQ(comm().backend(), CommBackend::mpi);
  EXPECT_NE(comm().name().find("mpi"), std::string::npos);
}

TEST_F(Ranks, AllReduceSumsF32AndBf16) {
  const int r = comm().rank();
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor x = make(1000, t);
    std::vector<float> v(1000);
    for (int i = 0; i < 1000; ++i)
      v[i] = static_cast<float>(i % 17) * 0.25f + static_cast<float>(r);
    dev->from_host_f32(x, v);
    comm().all_reduce(x);
    const std::vector<float> got = dev->to_host_f32(x);
    for (int i = 0; i < 1000; ++i)  // small multiples of 1/4: exact in bf16 too
      ASSERT_EQ(got[i], static_cast<float>(i % 17) * 0.5f + 1.0f) << dtype_name(t) << " " << i;
  }
}

// Started all-reduces (DDP's buckets during backward): several in flight at once, F32 and BF16,
// progressed between other work, each equal to the blocking one once wait_started returns.
TEST_F(Ranks, StartedAllReducesMatchTheBlockingOneAfterWait) {
  const int r = comm().rank();
  std::vector<Tensor> started, blocking;
  for (DType t : {DType::F32, DType::BF16, DType::F32}) {
    std::vector<float> v(3000);
    for (int i = 0; i < 3000; ++i)
      v[i] = static_cast<float>((i * 7 + static_cast<int>(started.size())) % 29) * 0.125f +
             static_cast<float>(r);
    started.push_back(make(3000, t));
    blocking.push_back(make(3000, t));
    dev->from_host_f32(started.back(), v);
    dev->from_host_f32(blocking.back(), v);
    comm().start_all_reduce(started.back());
    comm().progress();
  }
  for (Tensor& b : blocking) comm().all_reduce(b);
  comm().wait_started();
  for (std::size_t k = 0; k < started.size(); ++k) {
    const std::vector<float> got = dev->to_host_f32(started[k]),
                             want = dev->to_host_f32(blocking[k]);
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << k << " " << i;
  }
  comm().wait_started();  // nothing started: returns at once
}

TEST_F(Ranks, ReduceScatterAndAllGatherUnevenParts) {
  const int r = comm().rank();
  const std::int64_t n = 7;  // parts 4 and 3
  const std::vector<std::int64_t> parts = even_parts(n, 2);
  ASSERT_EQ(parts, (std::vector<std::int64_t>{4, 3}));
  Tensor full = make(n, DType::F32);
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 1.0f + 10.0f * static_cast<float>(r));  // r0: 1..7, r1: 11..17
  dev->from_host_f32(full, v);
  Tensor part = make(parts[static_cast<std::size_t>(r)], DType::F32);
  comm().reduce_scatter(full, part, parts);
  const std::vector<float> mine = dev->to_host_f32(part);
  const std::int64_t off = part_offset(parts, r);
  for (std::size_t i = 0; i < mine.size(); ++i)
    EXPECT_EQ(mine[i], 2.0f * static_cast<float>(off + static_cast<std::int64_t>(i)) + 12.0f);

  Tensor gathered = make(n, DType::F32);
  comm().all_gather(part, gathered, parts);
  const std::vector<float> all = dev->to_host_f32(gathered);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(all[i], 2.0f * static_cast<float>(i) + 12.0f);

  // In place: each rank writes only its part, then every part everywhere.
  Tensor in_place = make(n, DType::F32);
  std::vector<float> w(n, -1.0f);
  for (std::int64_t i = off; i < off + parts[static_cast<std::size_t>(r)]; ++i)
    w[static_cast<std::size_t>(i)] = static_cast<float>(i);
  dev->from_host_f32(in_place, w);
  comm().all_gather_in_place(in_place, parts);
  const std::vector<float> got = dev->to_host_f32(in_place);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], static_cast<float>(i));
}

TEST_F(Ranks, BroadcastAllToAllAndHostValues) {
  const int r = comm().rank();
  Tensor b = make(5, DType::I32);
  std::vector<float> v(5, static_cast<float>(r + 3));
  dev->from_host_f32(b, v);
  comm().broadcast(b, 1);
  for (float x : dev->to_host_f32(b)) EXPECT_EQ(x, 4.0f);

  // Rank 0 sends 1 element to itself and 2 to rank 1; rank 1 sends 3 to rank 0 and 1 to itself.
  const std::vector<std::int64_t> send =
      r == 0 ? std::vector<std::int64_t>{1, 2} : std::vector<std::int64_t>{3, 1};
  const std::vector<std::int64_t> recv =
      r == 0 ? std::vector<std::int64_t>{1, 3} : std::vector<std::int64_t>{2, 1};
  Tensor in = make(send[0] + send[1], DType::F32);
  std::vector<float> iv(static_cast<std::size_t>(in.numel()));
  for (std::size_t i = 0; i < iv.size(); ++i)
    iv[i] = 100.0f * static_cast<float>(r) + static_cast<float>(i);
  dev->from_host_f32(in, iv);
  Tensor out = make(recv[0] + recv[1], DType::F32);
  comm().all_to_all(in, send, out, recv);
  const std::vector<float> ov = dev->to_host_f32(out);
  const std::vector<float> want =
      r == 0 ? std::vector<float>{0, 100, 101, 102} : std::vector<float>{1, 2, 103};
  EXPECT_EQ(ov, want);

  EXPECT_EQ(comm().all_reduce_sum(1.5 + r), 4.0);
  EXPECT_EQ(comm().all_reduce_max(static_cast<double>(r)), 1.0);
  const std::int64_t mine[2] = {r, 10 * r};
  EXPECT_EQ(comm().all_gather_host(mine), (std::vector<std::int64_t>{0, 0, 1, 10}));
  comm().barrier();
}

// Groups (tensor and data parallelism's, kernels/parallel_state.h): a split by one color keeps
// both ranks in a group of its own whose collectives work; a split by rank gives groups of one,
// whose all-reduce leaves each rank's values as they are.
TEST_F(Ranks, SplitGroupsRunTheirOwnCollectives) {
  const int r = comm().rank();
  std::unique_ptr<Comm> both = comm().split(0, 1 - r);  // reversed order by key
  ASSERT_EQ(both->size(), 2);
  EXPECT_EQ(both->rank(), 1 - r);
  std::unique_ptr<Comm> alone = comm().split(r, 0);
  ASSERT_EQ(alone->size(), 1);
  EXPECT_EQ(alone->rank(), 0);
  Tensor x = make(4, DType::F32);
  dev->from_host_f32(x, std::vector<float>(4, 1.0f + static_cast<float>(r)));
  alone->all_reduce(x);
  EXPECT_EQ(dev->to_host_f32(x), std::vector<float>(4, 1.0f + static_cast<float>(r)));
  both->all_reduce(x);
  EXPECT_EQ(dev->to_host_f32(x), std::vector<float>(4, 3.0f));
  EXPECT_EQ(both->all_reduce_sum(static_cast<double>(r)), 1.0);
}

}  // namespace
}  // namespace memtrade
