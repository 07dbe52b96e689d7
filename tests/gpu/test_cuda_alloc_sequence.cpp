// The same ops make the same allocation sequence on both backends (library workspace aside),
// which is what lets CPU-only CI gate memory exactly. Compared: every alloc/free event of the
// devices' memory() allocators, by kind, rounded and requested size and category, excluding
// Category::workspace (cuBLASLt/cuDNN workspace and cast scratch on CUDA; im2col and the fp32
// copies OpenBLAS needs of 16-bit operands on the CPU). Op by op in every storage dtype, then
// whole training steps (model × precision × knob).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "models/config/config.h"
#include "models/model.h"
#include "models/train/trainer.h"

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
void run_workload(Device& d, DType dt) {
  Ops& ops = d.ops();
  const std::int64_t b = 2, t = 16, c = 32, v = 50, nh = 4;
  std::vector<float> toks(b * t);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<float>((i * 7) % v);
  Tensor tokens = d.empty({b, t}, DType::I32, Category::io);
  d.from_host_f32(tokens, toks);
  Tensor wte = d.empty({v, c}, dt, Category::params);
  Tensor wpe = d.empty({t, c}, dt, Category::params);
  Tensor w = d.empty({3 * c, c}, dt, Category::params);
  Tensor bias = d.empty({3 * c}, dt, Category::params);
  Tensor lnw = d.empty({c}, dt, Category::params);
  Tensor lnb = d.empty({c}, dt, Category::params);
  d.from_host_f32(wte, gputest::random_values(v * c, 1));
  d.from_host_f32(wpe, gputest::random_values(t * c, 2));
  d.from_host_f32(w, gputest::random_values(3 * c * c, 3));
  ops.fill(bias, 0.1f);
  ops.fill(lnw, 1.0f);
  ops.fill(lnb, 0.0f);
  {
    Tensor x = d.empty({b, t, c}, dt, Category::activations);
    ops.embedding_forward(x, tokens, wte, &wpe);
    Tensor ln = d.empty({b, t, c}, dt, Category::activations);
    Tensor mean = d.empty({b * t}, DType::F32, Category::activations);
    Tensor rstd = d.empty({b * t}, DType::F32, Category::activations);
    ops.layernorm_forward(ln, mean, rstd, x, lnw, lnb, 1e-5f);
    Tensor qkv = d.empty({b, t, 3 * c}, dt, Category::activations);
    ops.linear_forward(qkv, ln, w, &bias);
    Tensor att = d.empty({b, nh, t, t}, dt, Category::activations);
    Tensor y = d.empty({b, t, c}, dt, Category::activations);
    ops.attention_forward(y, att, qkv, static_cast<int>(nh), static_cast<int>(nh));
    {
      Tensor dyatt = d.empty({b, t, c}, dt, Category::temporaries);
      ops.fill(dyatt, 0.02f);
      Tensor dqkv_att = d.empty({b, t, 3 * c}, dt, Category::temporaries);
      ops.attention_backward(dqkv_att, dyatt, qkv, att, static_cast<int>(nh), static_cast<int>(nh));
      ops.attention_probs(att, qkv, static_cast<int>(nh), static_cast<int>(nh));
    }
    {  // flash attention on the same qkv; grouped-query math attention (NKV = 2)
      Tensor lse = d.empty({b, nh, t}, DType::F32, Category::activations);
      Tensor yf = d.empty({b, t, c}, dt, Category::activations);
      ops.flash_attention_forward(yf, lse, qkv, static_cast<int>(nh), static_cast<int>(nh));
      Tensor dyf = d.empty({b, t, c}, dt, Category::temporaries);
      ops.fill(dyf, 0.02f);
      Tensor dqf = d.empty({b, t, 3 * c}, dt, Category::temporaries);
      ops.flash_attention_backward(dqf, dyf, qkv, yf, lse, static_cast<int>(nh),
                                   static_cast<int>(nh));
      const std::int64_t nkv = 2, wg = (nh + 2 * nkv) * (c / nh);
      Tensor qg = d.empty({b, t, wg}, dt, Category::activations);
      d.from_host_f32(qg, gputest::random_values(b * t * wg, 7));
      Tensor ag = d.empty({b, nh, t, t}, dt, Category::activations);
      Tensor yg = d.empty({b, t, c}, dt, Category::activations);
      ops.attention_forward(yg, ag, qg, static_cast<int>(nh), static_cast<int>(nkv));
      Tensor dqg = d.empty({b, t, wg}, dt, Category::temporaries);
      ops.attention_backward(dqg, dyf, qg, ag, static_cast<int>(nh), static_cast<int>(nkv));
    }
    ops.gelu_forward(y, y);
    Tensor logits = d.empty({b * t, v}, dt, Category::activations);
    Tensor y2 = d.empty({b * t, c}, dt, Category::activations);
    ops.cast(y2, y);
    ops.matmul(logits, y2, wte, false, true, 1.0f, 0.0f);
    Tensor losses = d.empty({b * t}, DType::F32, Category::activations);
    ops.crossentropy_forward(losses, logits, tokens);
    (void)ops.sum_to_host(losses);
    Tensor dlogits = d.empty({b * t, v}, dt, Category::temporaries);
    ops.crossentropy_backward(dlogits, logits, tokens, 1.0f / (b * t));
    Tensor dwte = d.empty({v, c}, dt, Category::grads);
    Tensor dy = d.empty({b * t, c}, dt, Category::temporaries);
    ops.matmul(dy, dlogits, wte, false, false, 1.0f, 0.0f);
    ops.matmul(dwte, dlogits, y2, true, false, 1.0f, 0.0f);
    Tensor dqkv = d.empty({b, t, 3 * c}, dt, Category::temporaries);
    Tensor dln = d.empty({b, t, c}, dt, Category::temporaries);
    Tensor dw = d.empty({3 * c, c}, dt, Category::grads);
    Tensor dbias = d.empty({3 * c}, dt, Category::grads);
    ops.fill(dqkv, 0.01f);
    ops.linear_backward(&dln, &dw, &dbias, dqkv, ln, w, false);
    Tensor dx = d.empty({b, t, c}, dt, Category::temporaries);
    Tensor dlnw = d.empty({c}, dt, Category::grads);
    Tensor dlnb = d.empty({c}, dt, Category::grads);
    ops.layernorm_backward(dx, &dlnw, &dlnb, dln, x, lnw, mean, rstd, false);
    Tensor dwpe = d.empty({t, c}, dt, Category::grads);
    ops.embedding_backward(&dwte, &dwpe, dx, tokens, true);
    Tensor sm = d.empty({b * t, v}, dt, Category::activations);
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
    Tensor img = d.empty({2, 3, 12, 12}, dt, Category::io);
    d.from_host_f32(img, gputest::random_values(2 * 3 * 12 * 12, 5));
    Tensor cw = d.empty({8, 3, 3, 3}, dt, Category::params);
    d.from_host_f32(cw, gputest::random_values(8 * 27, 6));
    Tensor co = d.empty({2, 8, 12, 12}, dt, Category::activations);
    ops.conv2d_forward(co, img, cw, nullptr, 1, 1);
    Tensor gamma = d.empty({8}, dt, Category::params);
    Tensor beta = d.empty({8}, dt, Category::params);
    ops.fill(gamma, 1.0f);
    ops.fill(beta, 0.0f);
    Tensor bo = d.empty({2, 8, 12, 12}, dt, Category::activations);
    Tensor bm = d.empty({8}, DType::F32, Category::activations);
    Tensor bi = d.empty({8}, DType::F32, Category::activations);
    ops.batchnorm_forward(bo, bm, bi, co, gamma, beta, nullptr, nullptr, 1e-5f, 0.1f);
    ops.relu_forward(bo, bo);
    Tensor po = d.empty({2, 8, 6, 6}, dt, Category::activations);
    Tensor am = d.empty({2, 8, 6, 6}, DType::I32, Category::activations);
    ops.maxpool2d_forward(po, am, bo, 2, 2);
    Tensor gp = d.empty({2, 8}, dt, Category::activations);
    ops.global_avgpool_forward(gp, po);
    Tensor dgp = d.empty({2, 8}, dt, Category::temporaries);
    ops.fill(dgp, 1.0f);
    Tensor dpo = d.empty({2, 8, 6, 6}, dt, Category::temporaries);
    ops.global_avgpool_backward(dpo, dgp);
    Tensor dbo = d.empty({2, 8, 12, 12}, dt, Category::temporaries);
    ops.maxpool2d_backward(dbo, dpo, am);
    ops.relu_backward(dbo, dbo, bo);
    Tensor dco = d.empty({2, 8, 12, 12}, dt, Category::temporaries);
    Tensor dgamma = d.empty({8}, dt, Category::grads);
    Tensor dbeta = d.empty({8}, dt, Category::grads);
    ops.batchnorm_backward(dco, &dgamma, &dbeta, dbo, co, gamma, bm, bi, false);
    Tensor dimg = d.empty({2, 3, 12, 12}, dt, Category::temporaries);
    Tensor dcw = d.empty({8, 3, 3, 3}, dt, Category::grads);
    ops.conv2d_backward(&dimg, &dcw, nullptr, dco, img, cw, 1, 1, false);
  }
  d.synchronize();
}

class CudaAllocSequence : public gputest::CudaVsCpu, public ::testing::WithParamInterface<DType> {};

TEST_P(CudaAllocSequence, SameAsCpuExceptWorkspace) {
  for (Device* d : {cpu_.get(), gpu_.get()}) {
    d->memory().enable_trace(true);
    d->memory().clear_trace();
  }
  run_workload(*cpu_, GetParam());
  run_workload(*gpu_, GetParam());
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

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAllocSequence,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// Whole training steps: the Trainer on each backend, traced from the start (parameters, state,
// two steps), every non-workspace event equal. (Peaks are not compared: the instant of the peak
// moves with the workspace, which differs by design; equal sequences imply equal figures.)
struct StepCase {
  std::string label, model, precision, checkpoint, offload;
  std::string autocast_policy = "torch-cuda";
  std::string attention = "math";
};

void PrintTo(const StepCase& c, std::ostream* os) {
  *os << c.label;
}

class CudaStepAllocSequence : public gputest::CudaVsCpu,
                              public ::testing::WithParamInterface<StepCase> {};

TEST_P(CudaStepAllocSequence, SameAsCpuExceptWorkspace) {
  const StepCase& sc = GetParam();
  TrainConfig cfg;
  cfg.model = sc.model;
  cfg.batch_size = 4;
  cfg.precision = *parse_precision(sc.precision);
  cfg.checkpoint = *Checkpoint::parse(sc.checkpoint);
  cfg.offload = *parse_offload(sc.offload);
  cfg.autocast_policy = *autocast::parse_policy(sc.autocast_policy);
  cfg.attention = *parse_attention_kind(sc.attention);
  std::vector<Event> events[2];
  Device* devs[2] = {cpu_.get(), gpu_.get()};
  for (int i = 0; i < 2; ++i) {
    devs[i]->memory().enable_trace(true);
    devs[i]->memory().clear_trace();
    devs[i]->memory().reset_peak();
    auto model = make_model(sc.model);
    {
      Trainer trainer(*devs[i], *model, cfg);
      trainer.step();
      trainer.step();
      devs[i]->synchronize();
    }
    events[i] = user_events(devs[i]->memory());
    devs[i]->memory().enable_trace(false);
  }
  ASSERT_FALSE(events[0].empty());
  const std::size_t n = std::min(events[0].size(), events[1].size());
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(events[0][i], events[1][i]) << sc.label << ": first difference at event " << i;
  EXPECT_EQ(events[0].size(), events[1].size()) << sc.label;
}

INSTANTIATE_TEST_SUITE_P(
    Knobs, CudaStepAllocSequence,
    ::testing::Values(
        StepCase{"gpt_fp32", "gpt-tiny", "fp32", "0", "none"},
        StepCase{"gpt_bf16", "gpt-tiny", "bf16", "0", "none"},
        StepCase{"gpt_fp16", "gpt-tiny", "fp16", "0", "none"},
        StepCase{"gpt_bf16_pure", "gpt-tiny", "bf16-pure", "0", "none"},
        StepCase{"gpt_ck1", "gpt-tiny", "fp32", "1", "none"},
        StepCase{"gpt_selective", "gpt-tiny", "bf16", "selective", "none"},
        StepCase{"gpt_offload_act", "gpt-tiny", "bf16", "0", "activations"},
        StepCase{"gpt_offload_params", "gpt-tiny", "fp32", "0", "params"},
        StepCase{"gpt_offload_opt", "gpt-tiny", "fp32", "0", "optimizer"},
        StepCase{"mlp_fp16", "mlp-tiny", "fp16", "0", "none"},
        StepCase{"cnn_fp32", "cnn-tiny", "fp32", "0", "none"},
        StepCase{"cnn_bf16_ck1", "cnn-tiny", "bf16", "1", "none"},
        // autocast under the other policy, its recompute and streamed weights'
        // casts, and the O2 precisions
        StepCase{"gpt_bf16_torch_cpu", "gpt-tiny", "bf16", "0", "none", "torch-cpu"},
        StepCase{"gpt_bf16_ck1", "gpt-tiny", "bf16", "1", "none"},
        StepCase{"gpt_bf16_offload_params", "gpt-tiny", "bf16", "0", "params"},
        StepCase{"gpt_bf16_o2", "gpt-tiny", "bf16-o2", "0", "none"},
        StepCase{"gpt_fp16_o2_selective", "gpt-tiny", "fp16-o2", "selective", "none"},
        StepCase{"mlp_bf16_ck1", "mlp-tiny", "bf16", "1", "none"},
        StepCase{"cnn_bf16_o2", "cnn-tiny", "bf16-o2", "0", "none"},
        // Llama: RMSNorm, RoPE, SwiGLU, the stacked q/k/v projection and its
        // weight casts under autocast, tied and untied
        StepCase{"llama_fp32", "llama-tiny", "fp32", "0", "none"},
        StepCase{"llama_bf16", "llama-tiny", "bf16", "0", "none"},
        StepCase{"llama_bf16_o2_selective", "llama-tiny", "bf16-o2", "selective", "none"},
        StepCase{"llama_bf16_flash_ck1", "llama-tiny", "bf16", "1", "none", "torch-cuda", "flash"},
        StepCase{"llama_bf16_offload_params", "llama-tiny", "bf16", "0", "params"},
        StepCase{"llama_tied_fp16_torch_cpu", "llama-tiny:tie_word_embeddings=true", "fp16", "0",
                 "none", "torch-cpu"}),
    [](const auto& p) { return p.param.label; });

}  // namespace
}  // namespace memtrade
