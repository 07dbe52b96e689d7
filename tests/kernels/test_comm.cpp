// Comm without a second process: the parts rule, one rank (self) and the meta backend.
#include <gtest/gtest.h>

#include "kernels/comm.h"

namespace memtrade {
namespace {

TEST(Comm, EvenPartsCoverEveryElementOnce) {
  EXPECT_EQ(even_parts(10, 4), (std::vector<std::int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(even_parts(3, 4), (std::vector<std::int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(even_parts(8, 1), (std::vector<std::int64_t>{8}));
  for (std::int64_t n : {1, 7, 64, 1000, 4097})
    for (int ranks : {1, 2, 3, 8, 1024}) {
      const auto p = even_parts(n, ranks);
      std::int64_t sum = 0;
      for (std::size_t r = 0; r < p.size(); ++r) {
        EXPECT_LE(p[r], p[0]) << "rank 0 holds the largest part";
        sum += p[r];
      }
      EXPECT_EQ(sum, n);
      EXPECT_EQ(part_offset(p, ranks), n);
    }
  EXPECT_THROW(even_parts(4, 0), std::invalid_argument);
}

TEST(Comm, SelfIsTheIdentity) {
  auto c = make_self_comm();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_TRUE(c->moves_data());
  EXPECT_EQ(c->all_reduce_sum(2.5), 2.5);
  const std::int64_t v[2] = {3, 4};
  EXPECT_EQ(c->all_gather_host(v), (std::vector<std::int64_t>{3, 4}));
}

TEST(Comm, MetaPlaysAnyRankOfAnySize) {
  auto c = make_meta_comm(5, 1024);
  EXPECT_EQ(c->rank(), 5);
  EXPECT_EQ(c->size(), 1024);
  EXPECT_FALSE(c->moves_data());
  EXPECT_EQ(c->backend(), CommBackend::meta);
  EXPECT_THROW(make_meta_comm(2, 2), std::invalid_argument);
  EXPECT_THROW(make_meta_comm(0, 0), std::invalid_argument);
}

TEST(Comm, LibrariesAreNamed) {
  EXPECT_FALSE(mpi_library_version().empty());
  EXPECT_FALSE(nccl_library_version().empty());
}

}  // namespace
}  // namespace memtrade
