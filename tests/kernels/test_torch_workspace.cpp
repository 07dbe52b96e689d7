// PyTorch's CUDA workspaces as the memory model takes them (kernels/torch_workspace.h): each size
// against the figure PyTorch's source gives, and the dry-run ops of a CUDA target taking them
// where PyTorch's CUDA path does (the cuBLAS/cuBLASLt blocks per thread on the first GEMM, the
// embedding backward's sort buffers inside the op), named at the allocator's peak.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/gpu_specs.h"
#include "kernels/torch_workspace.h"
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

TEST(TorchWorkspace, CublasIs32MiBOnSm90AndTheDefaultConfigElsewhere) {
  // CublasHandlePool.cpp parseChosenWorkspaceSize: "4096 * 8 * 1024" on major 9 minor 0, else
  // ":4096:2:16:8" = 4096 * 1024 * 2 + 16 * 1024 * 8.
  EXPECT_EQ(cublas_workspace_bytes({9, 0}), 33'554'432u);
  EXPECT_EQ(cublas_workspace_bytes({8, 0}), 8'519'680u);
  EXPECT_EQ(cublas_workspace_bytes({8, 9}), 8'519'680u);
  EXPECT_EQ(cublas_workspace_bytes({10, 0}), 8'519'680u);  // sm90 exactly, not "9 and up"
  EXPECT_EQ(cublas_workspace_bytes(kDefaultCudaTarget), 33'554'432u);
}

TEST(TorchWorkspace, CublasLtIsOneMiBAtMostCublas) {
  // getCUDABlasLtWorkspaceSize: 1024 KiB, limited to cuBLAS's.
  for (ComputeCapability cc : {ComputeCapability{8, 0}, {8, 9}, {9, 0}, {10, 0}})
    EXPECT_EQ(cublaslt_workspace_bytes(cc), 1'048'576u);
}

TEST(TorchWorkspace, TheTablesGenerations) {
  auto cc = [](const char* name) {
    const GpuSpec* g = find_gpu(name);
    EXPECT_NE(g, nullptr) << name;
    const ComputeCapability c = compute_capability(g->arch);
    return std::pair(c.major, c.minor);
  };
  EXPECT_EQ(cc("a100-80g"), std::pair(8, 0));
  EXPECT_EQ(cc("l4"), std::pair(8, 9));
  EXPECT_EQ(cc("h100"), std::pair(9, 0));
  EXPECT_EQ(cc("h200"), std::pair(9, 0));
  EXPECT_EQ(cc("b200"), std::pair(10, 0));
}

TEST(TorchWorkspace, EmbeddingSortBuffers) {
  // Embedding.cu embedding_dense_backward_cuda: `num_indices <= 3072` takes no sort.
  const EmbeddingSortBuffers none = embedding_sort_buffers(3072, 128'256, 4096);
  EXPECT_EQ(none.index + none.range + none.sort_alt + none.segment_offsets + none.partials +
                none.partial_offsets + none.partial_sums,
            0);
  // Llama-3-8B at batch 1, 4096 tokens: int64 id buffers of 32 KiB, cub's alternate keys and
  // values 64 KiB; s = min(4096, 128256) = 4096 segments, p = 4096/10 + 4096 = 4505 partial
  // segments, grad_weight_per_segment (4505, 4096) fp32 = 73,809,920 B. The sort's 160 KiB are far
  // below the op's end: cub's storage left out cannot move its peak.
  const EmbeddingSortBuffers b = embedding_sort_buffers(4096, 128'256, 4096);
  EXPECT_EQ(b.index, 32'768);
  EXPECT_EQ(b.range, 32'768);
  EXPECT_EQ(b.sort_alt, 65'536);
  EXPECT_EQ(b.segment_offsets, 32'768);
  EXPECT_EQ(b.scalar, 8);
  EXPECT_EQ(b.partials, 32'768);
  EXPECT_EQ(b.partial_offsets, 4505 * 8);
  EXPECT_EQ(b.partial_sums, 73'809'920);
  EXPECT_EQ(b.cub_tiles_bound, 0);
  // A 50-row table with 16-wide rows: s = 50, p = 459; the sort (160 KiB + 2 KiB of rounding)
  // outweighs the op's end (132,168 B), and cub's bins (16 KiB), look-back (4 B a key) and
  // counters (2 KiB) may add 68,536 B to the op's peak.
  const EmbeddingSortBuffers small = embedding_sort_buffers(4096, 50, 16);
  EXPECT_EQ(small.partials, 400);
  EXPECT_EQ(small.partial_offsets, 459 * 8);
  EXPECT_EQ(small.partial_sums, 459 * 16 * 4);
  EXPECT_EQ(small.cub_tiles_bound, 68'536);
}

// (requested bytes, alloc or free) of the workspace events of fn().
class DryRunCudaWorkspace : public OpsTest {
 protected:
  template <typename F>
  std::vector<std::pair<std::size_t, bool>> workspace_events(F&& fn) {
    mem().clear_trace();
    mem().enable_trace(true);
    fn();
    mem().enable_trace(false);
    std::vector<std::pair<std::size_t, bool>> out;
    for (const TraceEvent& e : mem().trace())
      if (e.category == Category::workspace &&
          (e.kind == TraceEvent::Kind::alloc || e.kind == TraceEvent::Kind::free))
        out.emplace_back(e.requested, e.kind == TraceEvent::Kind::alloc);
    return out;
  }
};

TEST_F(DryRunCudaWorkspace, CublasPerThreadAndCublasLtForBiasedLinears) {
  auto a100 = make_dry_run_ops(Backend::cuda, nullptr, false, {8, 0});
  Tensor x = zeros({4, 8}), w = zeros({16, 8}), b = zeros({16}), out = zeros({4, 16});
  Tensor dx = zeros({4, 8}), dw = zeros({16, 8}), db = zeros({16}), dout = zeros({4, 16});
  using Events = std::vector<std::pair<std::size_t, bool>>;
  // The main thread's first GEMM, with a bias: its cuBLAS workspace, then cuBLASLt's.
  EXPECT_EQ(workspace_events([&] { a100->linear_forward(out, x, w, &b); }),
            (Events{{8'519'680, true}, {1'048'576, true}}));
  EXPECT_TRUE(workspace_events([&] { a100->linear_forward(out, x, w, &b); }).empty());
  EXPECT_TRUE(workspace_events([&] { a100->matmul(out, x, w, false, true, 1, 0); }).empty());
  // Backward is autograd's thread: its own handle, its own cuBLAS workspace; no Lt matmul.
  mem().set_phase("backward");
  EXPECT_EQ(workspace_events([&] { a100->linear_backward(&dx, &dw, &db, dout, x, w, false); }),
            (Events{{8'519'680, true}}));
  // A checkpointed segment's recomputation runs there too: the Lt workspace of that thread.
  EXPECT_EQ(workspace_events([&] { a100->linear_forward(out, x, w, &b); }),
            (Events{{1'048'576, true}}));
  mem().set_phase("");
  const DryRunWorkspace ws = dry_run_workspace(*a100);
  using Named = std::vector<std::pair<std::string, std::int64_t>>;
  EXPECT_EQ(ws.at_peak, (Named{{"cublas_main_thread", 8'519'680},
                               {"cublaslt_main_thread", 1'048'576},
                               {"cublas_autograd_thread", 8'519'680},
                               {"cublaslt_autograd_thread", 1'048'576}}));
  // The CPU target takes none of them (its fp32 copies are the CPU's own workspace).
  auto cpu = make_dry_run_ops(Backend::cpu);
  for (const auto& [bytes, alloc] : workspace_events([&] { cpu->linear_forward(out, x, w, &b); }))
    EXPECT_NE(bytes, 8'519'680u);
  EXPECT_TRUE(dry_run_workspace(*cpu).at_peak.empty());
}

TEST_F(DryRunCudaWorkspace, TheEmbeddingSortsOnlyAbove3072IndicesAndFreesEverything) {
  auto h100 = make_dry_run_ops(Backend::cuda);
  const std::int64_t c = 16;
  Tensor dwte = zeros({50, c}), dwpe = zeros({2048, c});
  for (std::int64_t n : {3072, 4096}) {
    SCOPED_TRACE(n);
    Tensor tokens = ints({2, n / 2}, std::vector<std::int32_t>(static_cast<std::size_t>(n), 1));
    Tensor dout = zeros({2, n / 2, c});
    const auto events =
        workspace_events([&] { h100->embedding_backward(&dwte, &dwpe, dout, tokens, false); });
    if (n == 3072) {
      EXPECT_TRUE(events.empty());
      continue;
    }
    const auto i = static_cast<std::size_t>(n) * 8;  // one int64 index buffer
    // sorted and original indices, arange and cub's alternates (freed after the sort), then
    // segment_offsets (n), a scalar, the two per-segment buffers (min(n, 50) = 50), a scalar,
    // partial_segment_offset (n/10 + 50 = 459) and grad_weight_per_segment (459, 16) fp32; then
    // every one freed. Position embeddings sort T = 2048 <= 3072 positions: nothing.
    using Events = std::vector<std::pair<std::size_t, bool>>;
    const Events want = {{i, true},           {i, true},   {i, true}, {2 * i, true},
                         {2 * i, false},      {i, false},  {i, true}, {8, true},
                         {400, true},         {400, true}, {8, true}, {459 * 8, true},
                         {459 * 16 * 4, true}};
    ASSERT_GE(events.size(), want.size());
    EXPECT_EQ(Events(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(want.size())),
              want);
    std::size_t allocs = 0, frees = 0;
    for (const auto& [bytes, alloc] : events) (alloc ? allocs : frees)++;
    EXPECT_EQ(allocs, frees);
    // With 50 rows the sort holds more than the op's end: the peak is there, named.
    using Named = std::vector<std::pair<std::string, std::int64_t>>;
    const DryRunWorkspace ws = dry_run_workspace(*h100);
    EXPECT_EQ(ws.at_peak, (Named{{"embedding_sort_indices", 2 * static_cast<std::int64_t>(i)},
                                 {"embedding_sort_range", static_cast<std::int64_t>(i)},
                                 {"embedding_sort_cub", 2 * static_cast<std::int64_t>(i)}}));
    EXPECT_EQ(ws.embedding_cub_bound, 68'536);
    EXPECT_EQ(dry_run_workspace(*h100).embedding_sorts, 1);
  }
}

}  // namespace
}  // namespace memtrade::test
