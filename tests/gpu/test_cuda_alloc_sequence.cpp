// The same ops make the same allocation sequence on both backends (library workspace aside),
// which is what lets CPU-only CI gate memory exactly. Compared: every alloc/free event of the
// devices' memory() allocators, by kind, rounded and requested size and category, excluding
// Category::workspace (cuBLASLt/cuDNN workspace and cast scratch on CUDA; im2col on the CPU).
//
// fp32 only: for 16-bit operands the CPU needs fp32 copies for OpenBLAS (temporaries) where
// cuBLASLt and cuDNN take 16-bit directly. attention_backward is left out on purpose: its dP
// scratch is one (T, T) slice on the CPU and (B, NH, T, T) on CUDA (see cuda_ops.h).
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace memtrade {
namespace {

using Event = std::tuple<int, std::size_t, std::size_t, int>;

std::vector<Event> user_events(const CachingAllocator& a) {
  std::vector<Event> out;
  for (const TraceEvent& e : a.trace()) {
    if (e.category == Category::workspace) continue;
    if (e.kind != TraceEvent::Kind::alloc && e.kind != TraceEvent::Kind::free) continue;
    out.emplace_back(static_cast<int>(e.kind), e.bytes, e.requested, static_cast<int>(e.category));
  }
  return out;
}

// A small training-like sequence of ops on one device, allocating as models do.
void run_workload(Device& d) {
  Ops& ops = d.ops();
  const std::int64_t b = 2, t = 16, c = 32, v = 50, nh = 4;
  std::vector<float> toks(b * t);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<float>((i * 7) % v);
  Tensor tokens = d.empty({b, t}, DType::I32, Category::io);
  d.from_host_f32(tokens, toks);
  Tensor wte = d.empty({v, c}, DType::F32, Category::params);
  Tensor wpe = d.empty({t, c}, DType::F32, Category::params);
  Tensor w = d.empty({3 * c, c}, DType::F32, Category::params);
  Tensor bias = d.empty({3 * c}, DType::F32, Category::params);
  Tensor lnw = d.empty({c}, DType::F32, Category::params);
  Tensor lnb = d.empty({c}, DType::F32, Category::params);
  d.from_host_f32(wte, gputest::random_values(v * c, 1));
  d.from_host_f32(wpe, gputest::random_values(t * c, 2));
  d.from_host_f32(w, gputest::random_values(3 * c * c, 3));
  ops.fill(bias, 0.1f);
  ops.fill(lnw, 1.0f);
  ops.fill(lnb, 0.0f);
  {
    Tensor x = d.empty({b, t, c}, DType::F32, Category::activations);
    ops.embedding_forward(x, tokens, wte, wpe);
    Tensor ln = d.empty({b, t, c}, DType::F32, Category::activations);
    Tensor mean = d.empty({b * t}, DType::F32, Category::activations);
    Tensor rstd = d.empty({b * t}, DType::F32, Category::activations);
    ops.layernorm_forward(ln, mean, rstd, x, lnw, lnb, 1e-5f);
    Tensor qkv = d.empty({b, t, 3 * c}, DType::F32, Category::activations);
    ops.linear_forward(qkv, ln, w, &bias);
    Tensor att = d.empty({b, nh, t, t}, DType::F32, Category::activations);
    Tensor y = d.empty({b, t, c}, DType::F32, Category::activations);
    ops.attention_forward(y, att, qkv, static_cast<int>(nh));
    ops.gelu_forward(y, y);
    Tensor logits = d.empty({b * t, v}, DType::F32, Category::activations);
    Tensor y2 = d.empty({b * t, c}, DType::F32, Category::activations);
    ops.cast(y2, y);
    ops.matmul(logits, y2, wte, false, true, 1.0f, 0.0f);
    Tensor losses = d.empty({b * t}, DType::F32, Category::activations);
    ops.crossentropy_forward(losses, logits, tokens);
    (void)ops.sum_to_host(losses);
    Tensor dlogits = d.empty({b * t, v}, DType::F32, Category::temporaries);
    ops.crossentropy_backward(dlogits, logits, tokens, 1.0f / (b * t));
    Tensor dwte = d.empty({v, c}, DType::F32, Category::grads);
    Tensor dy = d.empty({b * t, c}, DType::F32, Category::temporaries);
    ops.matmul(dy, dlogits, wte, false, false, 1.0f, 0.0f);
    ops.matmul(dwte, dlogits, y2, true, false, 1.0f, 0.0f);
    Tensor dqkv = d.empty({b, t, 3 * c}, DType::F32, Category::temporaries);
    Tensor dln = d.empty({b, t, c}, DType::F32, Category::temporaries);
    Tensor dw = d.empty({3 * c, c}, DType::F32, Category::grads);
    Tensor dbias = d.empty({3 * c}, DType::F32, Category::grads);
    ops.fill(dqkv, 0.01f);
    ops.linear_backward(&dln, &dw, &dbias, dqkv, ln, w, false);
    Tensor dx = d.empty({b, t, c}, DType::F32, Category::temporaries);
    Tensor dlnw = d.empty({c}, DType::F32, Category::grads);
    Tensor dlnb = d.empty({c}, DType::F32, Category::grads);
    ops.layernorm_backward(dx, &dlnw, &dlnb, dln, x, lnw, mean, rstd, false);
    Tensor dwpe = d.empty({t, c}, DType::F32, Category::grads);
    ops.embedding_backward(&dwte, &dwpe, dx, tokens, true);
    Tensor sm = d.empty({b * t, v}, DType::F32, Category::activations);
    ops.softmax_forward(sm, logits);
    ops.softmax_backward(dlogits, dlogits, sm);
    std::vector<Tensor*> grads{&dwte, &dwpe, &dw, &dbias, &dlnw, &dlnb};
    (void)ops.unscale_and_check(grads, 1.0f);
    Tensor m = d.empty({3 * c, c}, DType::F32, Category::optimizer);
    Tensor v2 = d.empty({3 * c, c}, DType::F32, Category::optimizer);
    ops.fill(m, 0.0f);
    ops.fill(v2, 0.0f);
    OptimizerHyper h;
    h.kind = OptimizerKind::adamw;
    ops.optimizer_update(h, w, dw, &m, &v2);
  }
  {  // convolution network pieces
    Tensor img = d.empty({2, 3, 12, 12}, DType::F32, Category::io);
    d.from_host_f32(img, gputest::random_values(2 * 3 * 12 * 12, 5));
    Tensor cw = d.empty({8, 3, 3, 3}, DType::F32, Category::params);
    d.from_host_f32(cw, gputest::random_values(8 * 27, 6));
    Tensor co = d.empty({2, 8, 12, 12}, DType::F32, Category::activations);
    ops.conv2d_forward(co, img, cw, nullptr, 1, 1);
    Tensor gamma = d.empty({8}, DType::F32, Category::params);
    Tensor beta = d.empty({8}, DType::F32, Category::params);
    ops.fill(gamma, 1.0f);
    ops.fill(beta, 0.0f);
    Tensor bo = d.empty({2, 8, 12, 12}, DType::F32, Category::activations);
    Tensor bm = d.empty({8}, DType::F32, Category::activations);
    Tensor bi = d.empty({8}, DType::F32, Category::activations);
    ops.batchnorm_forward(bo, bm, bi, co, gamma, beta, nullptr, nullptr, 1e-5f, 0.1f);
    ops.relu_forward(bo, bo);
    Tensor po = d.empty({2, 8, 6, 6}, DType::F32, Category::activations);
    Tensor am = d.empty({2, 8, 6, 6}, DType::I32, Category::activations);
    ops.maxpool2d_forward(po, am, bo, 2, 2);
    Tensor gp = d.empty({2, 8}, DType::F32, Category::activations);
    ops.global_avgpool_forward(gp, po);
    Tensor dgp = d.empty({2, 8}, DType::F32, Category::temporaries);
    ops.fill(dgp, 1.0f);
    Tensor dpo = d.empty({2, 8, 6, 6}, DType::F32, Category::temporaries);
    ops.global_avgpool_backward(dpo, dgp);
    Tensor dbo = d.empty({2, 8, 12, 12}, DType::F32, Category::temporaries);
    ops.maxpool2d_backward(dbo, dpo, am);
    ops.relu_backward(dbo, dbo, bo);
    Tensor dco = d.empty({2, 8, 12, 12}, DType::F32, Category::temporaries);
    Tensor dgamma = d.empty({8}, DType::F32, Category::grads);
    Tensor dbeta = d.empty({8}, DType::F32, Category::grads);
    ops.batchnorm_backward(dco, &dgamma, &dbeta, dbo, co, gamma, bm, bi, false);
    Tensor dimg = d.empty({2, 3, 12, 12}, DType::F32, Category::temporaries);
    Tensor dcw = d.empty({8, 3, 3, 3}, DType::F32, Category::grads);
    ops.conv2d_backward(&dimg, &dcw, nullptr, dco, img, cw, 1, 1, false);
  }
  d.synchronize();
}

class CudaAllocSequence : public gputest::CudaVsCpu {};

TEST_F(CudaAllocSequence, SameAsCpuExceptWorkspace) {
  for (Device* d : {cpu_.get(), gpu_.get()}) {
    d->memory().enable_trace(true);
    d->memory().clear_trace();
  }
  run_workload(*cpu_);
  run_workload(*gpu_);
  const auto cpu_events = user_events(cpu_->memory());
  const auto gpu_events = user_events(gpu_->memory());
  ASSERT_FALSE(cpu_events.empty());
  ASSERT_EQ(cpu_events.size(), gpu_events.size());
  for (std::size_t i = 0; i < cpu_events.size(); ++i)
    ASSERT_EQ(cpu_events[i], gpu_events[i]) << "first difference at event " << i;
  // Same peaks for everything but the workspace.
  const auto& cs = cpu_->memory().stats();
  const auto& gs = gpu_->memory().stats();
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    if (c == static_cast<std::size_t>(Category::workspace)) continue;
    EXPECT_EQ(cs.by_category[c], gs.by_category[c]) << category_name(static_cast<Category>(c));
  }
}

}  // namespace
}  // namespace memtrade
