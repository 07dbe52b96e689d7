#include "models/config/knobs.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/config/hf_config.h"
#include "models/config/input_text.h"
#include "models/model.h"
#include "models/model_desc.h"
#include "models/train/saved_tensors.h"

namespace memtrade {
namespace {

std::string expected(const std::vector<std::string>& accepted) {
  return fmt::format("expected one of: {}", fmt::join(accepted, ", "));
}

// A row for an enum field: its spellings come from models/config/config.cpp (their one home).
template <typename E>
Knob enum_knob(std::string name, std::string flag, std::string prefix, std::string help,
               E TrainConfig::*field, std::string_view (*to_text)(E),
               std::optional<E> (*parse)(std::string_view), std::vector<std::string> (*all)()) {
  Knob k;
  k.name = std::move(name);
  k.flag = std::move(flag);
  k.id_prefix = std::move(prefix);
  k.type = KnobType::text;
  k.help = std::move(help);
  k.choices = all;
  k.get = [field, to_text](const TrainConfig& c) { return std::string(to_text(c.*field)); };
  k.set = [field, parse, all](TrainConfig& c, std::string_view text) -> std::optional<std::string> {
    auto v = parse(text);
    if (!v) return fmt::format("unknown value '{}' ({})", echo(text), expected(all()));
    c.*field = *v;
    return std::nullopt;
  };
  return k;
}

// A row for a positive integer field, up to `max`.
Knob count_knob(std::string name, std::string flag, std::string prefix, std::string help,
                std::int64_t TrainConfig::*field, std::vector<std::string> examples,
                std::int64_t max) {
  Knob k;
  k.name = std::move(name);
  k.flag = std::move(flag);
  k.id_prefix = std::move(prefix);
  k.type = KnobType::integer;
  k.help = std::move(help);
  k.values_text = "a positive integer";
  k.examples = std::move(examples);
  k.get = [field](const TrainConfig& c) { return std::to_string(c.*field); };
  k.set = [field, max](TrainConfig& c, std::string_view text) -> std::optional<std::string> {
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < 1)
      return fmt::format("must be a positive integer, got '{}'", echo(text));
    if (v > max) return fmt::format("{} is above memtrade's bound of {}", v, max);
    c.*field = v;
    return std::nullopt;
  };
  return k;
}

// The longest sequence of a point's model (0: it has none); unknown models have none.
std::int64_t max_seq_len_of(TrainConfig c) {
  c.seq_len = 0;
  c.tensor_parallel = 1;  // the model's own, whatever split its tp row asks (checked there)
  c.expert_parallel = 1;  // and its ep row
  try {
    return make_model(c)->max_seq_len();
  } catch (const std::invalid_argument&) {
    return 0;
  }
}

bool has_sequence(const TrainConfig& c) {
  return max_seq_len_of(c) > 0;
}

// Advise's micro-batch sizes (and accumulation counts): every divisor of the start's samples per
// optimizer step, so that some partner value keeps the product.
std::vector<std::string> step_divisors(const TrainConfig& start) {
  std::vector<std::string> out;
  const std::int64_t n = samples_per_step(start);
  for (std::int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(std::to_string(d));
  return out;
}

// Advise's checkpoint values: none, all, sqrt, selective, and a quarter, half and three quarters
// of the blocks, evenly spaced or the first ones (which blocks). Values whose plan repeats an
// earlier one on this model are dropped (gpt-tiny's 2 blocks: 0.25 and 0.5 are the same plan).
std::vector<std::string> checkpoint_candidates(const TrainConfig& start) {
  int blocks = 0;
  try {
    blocks = make_model(start)->num_blocks();
  } catch (const std::invalid_argument&) {
    return {};
  }
  std::vector<std::string> out;
  std::vector<std::pair<std::vector<CheckpointPlan::Segment>, bool>> seen;
  for (const char* text : {"0", "first0.25", "0.25", "first0.5", "0.5", "first0.75", "0.75", "1",
                           "sqrt", "selective"}) {
    const CheckpointPlan plan = CheckpointPlan::make(*Checkpoint::parse(text), blocks);
    auto same = [&](const auto& s) {
      return s.second == plan.selective &&
             std::equal(s.first.begin(), s.first.end(), plan.segments.begin(), plan.segments.end(),
                        [](const auto& a, const auto& b) {
                          return a.begin == b.begin && a.end == b.end && a.recompute == b.recompute;
                        });
    };
    if (std::any_of(seen.begin(), seen.end(), same)) continue;
    seen.emplace_back(plan.segments, plan.selective);
    out.emplace_back(text);
  }
  return out;
}

// The model axis: a listed model, optionally with overrides of its family's hyper-parameters.
Knob model_knob() {
  Knob model;
  model.name = "model";
  model.flag = "--model";
  model.type = KnobType::text;
  model.workload = true;
  model.help =
      "The network (see `memtrade knobs`: gpt-*, llama-*, mlp-*, cnn-*); gpt-* and llama-* take "
      "overrides of their hyper-parameters: llama-tiny:n_layer=4,n_kv_head=1";
  model.choices = [] { return model_names(); };
  model.get = [](const TrainConfig& c) { return c.model; };
  // A model config file defines the model: its id part (cfg-...) names it, "hf" holds the place.
  model.id_text = [](const TrainConfig& c) { return c.model_config.empty() ? c.model : "hf"; };
  model.set = [](TrainConfig& c, std::string_view text) -> std::optional<std::string> {
    const auto names = model_names();
    const std::string_view base = text.substr(0, text.find(':'));
    if (std::find(names.begin(), names.end(), base) == names.end())
      return fmt::format("unknown value '{}' ({})", echo(text), expected(names));
    // The value this config's model was resolved from is not parsed again; a model config
    // file's description stays (the file defines the model, the value holds the place).
    const bool file = c.model_desc && !c.model_desc->model_config.empty();
    if (!file && c.model_desc && c.model_desc->model == text) {
      c.model = c.model_desc->model;
      return std::nullopt;
    }
    try {
      auto d = resolve_model(text);         // canonical: one configuration, one spelling
      (void)make_model(*d, TrainConfig{});  // a shape the model cannot take throws here
      c.model = d->model;
      if (!file) c.model_desc = std::move(d);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::nullopt;
  };
  return model;
}

// The model_config axis: a Hugging Face config.json defines the model.
Knob model_config_knob() {
  Knob k;
  k.name = "model_config";
  k.flag = "--model-config";
  k.id_prefix = "cfg-";
  k.id_rule = IdRule::non_default;
  k.type = KnobType::text;
  k.workload = true;
  k.help =
      "A Hugging Face config.json (LlamaForCausalLM, Qwen2ForCausalLM or GPT2LMHeadModel) that "
      "defines the model, "
      "instead of --model (left at its default); the id names it by file name and SHA-256";
  k.values_text = "a config.json path, or empty for none";
  k.examples = {""};
  k.get = [](const TrainConfig& c) { return c.model_config; };
  k.id_text = [](const TrainConfig& c) {
    return fmt::format("{}-{}", std::filesystem::path(c.model_config).stem().string(),
                       c.model_config_sha256.substr(0, 8));
  };
  k.set = [](TrainConfig& c, std::string_view text) -> std::optional<std::string> {
    if (text.empty()) {
      if (c.model_desc && !c.model_desc->model_config.empty()) c.model_desc = nullptr;
      c.model_config.clear();
      c.model_config_sha256.clear();
      return std::nullopt;
    }
    // The file this config's model was read from is not read again (models/model_desc.h).
    std::shared_ptr<const ModelDesc> d = c.model_desc;
    if (!d || d->model_config != text) {
      try {
        d = resolve_model_config(std::string(text));
        (void)make_model(*d, TrainConfig{});  // a shape the layers cannot take fails here
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
    }
    c.model_config = d->model_config;
    c.model_config_sha256 = d->sha256;
    c.model_desc = std::move(d);
    return std::nullopt;
  };
  k.resolve = [](TrainConfig& c) -> std::optional<std::string> {
    if (!c.model_config.empty() && c.model != TrainConfig{}.model)
      return fmt::format("{} defines the model: leave --model at its default (got {})",
                         echo(c.model_config, kEchoPathMax), echo(c.model));
    return std::nullopt;
  };
  return k;
}

std::vector<Knob> make_table() {
  std::vector<Knob> t;

  t.push_back(model_knob());

  // batch_size × accumulation is what the optimizer step averages over: advise moves factors
  // between them and keeps the product.
  // The bounds on both: a million samples per micro-batch (or micro-batches per step) is beyond
  // any device and any run, and keeps batch × sequence × hidden far inside 64 bits.
  constexpr std::int64_t kMaxSamples = 1 << 20;
  t.push_back(count_knob("batch_size", "--batch-size", "b", "Samples per micro-batch",
                         &TrainConfig::batch_size, {"1", "8"}, kMaxSamples));
  t.back().workload = true;
  t.back().advise = AdviseRole::turn;
  t.back().advise_values = step_divisors;
  t.back().cost = CostDriver::structure;
  t.push_back(count_knob("accumulation", "--accumulation", "a",
                         "Micro-batches per optimizer step (gradient accumulation)",
                         &TrainConfig::accumulation, {"1", "4"}, kMaxSamples));
  t.back().advise = AdviseRole::turn;
  t.back().advise_values = step_divisors;
  t.back().cost = CostDriver::structure;
  t.push_back(enum_knob("precision", "--precision", "",
                        "fp32, tf32 (CUDA), fp16/bf16 as torch.autocast (fp32 weights, per-op "
                        "dtypes: --autocast-policy), fp16-o2/bf16-o2 (Apex O2: 16-bit weights "
                        "and activations, fp32 master copy), fp16-pure/bf16-pure (no master)",
                        &TrainConfig::precision, precision_name, parse_precision, precision_names));
  t.back().advise = AdviseRole::allow;

  // Qualifies the autocast precisions: in their ids even at its default, in no other id.
  Knob policy = enum_knob(
      "autocast_policy", "--autocast-policy", "ac-",
      "Whose autocast op lists fp16/bf16 follow: PyTorch's CUDA lists (on every backend), or "
      "its CPU lists (torch 1.13), which a CPU-only machine can check against PyTorch",
      &TrainConfig::autocast_policy, autocast::policy_name, autocast::parse_policy,
      autocast::policy_names);
  policy.id_rule = IdRule::when_applies;
  policy.applies = [](const TrainConfig& c) { return autocast_dtype(c.precision).has_value(); };
  t.push_back(std::move(policy));

  Knob ck;
  ck.name = "checkpoint";
  ck.flag = "--checkpoint";
  ck.id_prefix = "ck";
  ck.type = KnobType::density;
  ck.help =
      "Activation checkpointing (torch.utils.checkpoint, non-reentrant): the fraction of blocks "
      "recomputed in backward (evenly spaced, or first<d>: the first ones), sqrt (√n segments), "
      "or selective (Megatron: only the attention core of each block; CNN: bn1-relu-conv2)";
  ck.values_text = "a density in [0, 1], first<density>, sqrt or selective";
  ck.examples = {"0", "0.5", "1", "first0.5", "sqrt", "selective"};
  ck.get = [](const TrainConfig& c) { return c.checkpoint.str(); };
  ck.set = [](TrainConfig& c, std::string_view text) -> std::optional<std::string> {
    auto v = Checkpoint::parse(text);
    const std::string_view number = text.starts_with("first") ? text.substr(5) : text;
    double d = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), d);
    if (!v && ec == std::errc() && end == number.data() + number.size())
      return fmt::format("density {} is outside [0, 1]", echo(number));
    if (!v)
      return fmt::format("'{}' is not a density in [0, 1], first<density>, 'sqrt' or 'selective'",
                         echo(text));
    c.checkpoint = *v;
    return std::nullopt;
  };
  ck.advise = AdviseRole::turn;
  ck.advise_values = checkpoint_candidates;
  ck.cost = CostDriver::recompute;
  t.push_back(std::move(ck));

  t.push_back(enum_knob("optimizer", "--optimizer", "",
                        "Optimizer (state per parameter: sgd 0, momentum/adagrad/rmsprop 1, "
                        "adam/adamw 2 fp32 copies)",
                        &TrainConfig::optimizer, optimizer_name, parse_optimizer, optimizer_names));
  t.back().advise = AdviseRole::allow;
  t.back().cost = CostDriver::params;
  t.push_back(enum_knob("offload", "--offload", "off-",
                        "CPU offload: saved activations, optimizer state and update "
                        "(ZeRO-Offload), or the block weights themselves",
                        &TrainConfig::offload, offload_name, parse_offload, offload_names));
  t.back().advise = AdviseRole::turn;
  t.back().cost = CostDriver::copies;
  t.back().only_costs = true;
  t.push_back(enum_knob("zero_grad", "--zero-grad", "zg-",
                        "zero_grad(set_to_none=True) frees the grads after the step; zero keeps "
                        "and zero-fills them",
                        &TrainConfig::zero_grad, zero_grad_name, parse_zero_grad, zero_grad_names));
  t.back().advise = AdviseRole::turn;
  t.back().cost = CostDriver::params;
  t.back().only_costs = true;
  t.push_back(enum_knob("mode", "--mode", "",
                        "train, or eval: forward only with nothing saved (the no-grad path)",
                        &TrainConfig::mode, mode_name, parse_mode, mode_names));
  t.push_back(enum_knob(
      "empty_cache", "--empty-cache", "ec-", "torch.cuda.empty_cache() after every step, or never",
      &TrainConfig::empty_cache, empty_cache_name, parse_empty_cache, empty_cache_names));
  t.back().advise = AdviseRole::turn;
  t.back().cost = CostDriver::reserved;
  t.back().only_costs = true;
  t.push_back(enum_knob("input", "--input", "in-",
                        "Host memory the batch is staged in before its copy to the device",
                        &TrainConfig::input, input_name, parse_input, input_names));

  Knob seq;
  seq.name = "seq_len";
  seq.flag = "--seq-len";
  seq.id_prefix = "seq";
  seq.id_rule = IdRule::non_default;
  seq.type = KnobType::integer;
  seq.workload = true;
  seq.help =
      "Tokens per training sequence of a GPT or Llama model (0: the model's own positions); "
      "activations grow linearly and, with math attention, quadratically in it";
  seq.values_text = "0 or a positive integer up to the model's positions";
  seq.examples = {"0", "16"};
  seq.get = [](const TrainConfig& c) { return std::to_string(c.seq_len); };
  seq.set = [](TrainConfig& c, std::string_view text) -> std::optional<std::string> {
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < 0)
      return fmt::format("must be 0 (the model's own) or a positive integer, got '{}'", echo(text));
    c.seq_len = v;
    return std::nullopt;
  };
  seq.applies = has_sequence;
  seq.resolve = [](TrainConfig& c) -> std::optional<std::string> {
    if (c.seq_len == 0) return std::nullopt;
    const std::int64_t max = max_seq_len_of(c);
    const std::string model = echo(c.model_config.empty() ? c.model : c.model_config, kEchoPathMax);
    if (max == 0)
      return fmt::format("{} has no sequence length (GPT-style models have one)", model);
    if (c.seq_len > max) {
      // A Llama-like model with a sliding window takes sequences up to the window (no banded
      // mask yet, models/families/llama.h): its own message names the key.
      try {
        (void)make_model(c);
      } catch (const std::invalid_argument& e) {
        if (std::string_view(e.what()).find("sliding_window") != std::string_view::npos)
          return std::string(e.what());
      }
      return fmt::format("{} is above {}'s maximum positions ({})", c.seq_len, model, max);
    }
    if (c.seq_len == max) c.seq_len = 0;  // the model's own: one id for one configuration
    return std::nullopt;
  };
  t.push_back(std::move(seq));

  Knob attn = enum_knob("attention", "--attention", "attn-",
                        "Attention kernel: math saves the (B, heads, T, T) probabilities; flash "
                        "saves the output and a log-sum-exp per row and recomputes the scores in "
                        "backward (FlashAttention-2, torch scaled_dot_product_attention)",
                        &TrainConfig::attention, attention_kind_name, parse_attention_kind,
                        attention_kind_names);
  attn.id_rule = IdRule::non_default;
  attn.applies = has_sequence;
  // Gemma 2's soft-capped scores (or a scale other than 1/√head_dim, query_pre_attn_scalar): the
  // flash op has neither (FlashAttention-2 has a softcap; memtrade's does not), so flash is a
  // combination refused here, which advise skips (models/layers/attention.cpp refuses it too).
  attn.resolve = [](TrainConfig& c) -> std::optional<std::string> {
    if (c.attention != AttentionKind::flash) return std::nullopt;
    TrainConfig whole = c;
    whole.seq_len = 0;
    whole.tensor_parallel = 1;
    whole.expert_parallel = 1;
    nlohmann::json h;
    try {
      h = make_model(whole)->hyper();
    } catch (const std::invalid_argument&) {
      return std::nullopt;  // the model's own knobs say what is wrong
    }
    const double cap = h.value("attn_softcap", 0.0), scalar = h.value("query_pre_attn_scalar", 0.0);
    if (cap > 0 || (scalar > 0 && scalar != h.value("head_dim", 0.0)))
      return std::string(
          "flash attention with attn_logit_softcapping or query_pre_attn_scalar (Gemma 2) is not "
          "modelled: use --attention math");
    return std::nullopt;
  };
  attn.advise = AdviseRole::turn;
  t.push_back(std::move(attn));

  t.push_back(model_config_knob());

  // Data parallelism (models/train/data_parallel.h): the ranks, and what is sharded over them.
  // 65536 ranks bound the estimator's meta runs; a real run launches that many processes.
  t.push_back(count_knob("data_parallel", "--dp", "dp",
                         "Data-parallel ranks (MPI processes on the CPU, one GPU each with NCCL); "
                         "batch_size stays per rank, so a step trains on dp × batch × "
                         "accumulation samples, rank r on its contiguous share",
                         &TrainConfig::data_parallel, {"1", "2"}, 65536));
  t.back().id_rule = IdRule::non_default;
  t.back().resolve = [](TrainConfig& c) -> std::optional<std::string> {
    if (c.data_parallel > 1 && c.sharding == Sharding::torch_zero1 &&
        c.offload == Offload::optimizer)
      return std::string(
          "offload optimizer with sharding torch-zero1 is not a PyTorch combination "
          "(ZeroRedundancyOptimizer updates on the device): use zero1 for ZeRO-Offload");
    if (c.data_parallel > 1 && c.offload == Offload::params)
      return std::string(
          "offload params with data parallelism is not modelled (each rank would stream its "
          "block weights from host memory; zero3 shards them instead): use offload none, "
          "activations or optimizer");
    return std::nullopt;
  };
  Knob sharding = enum_knob(
      "sharding", "--sharding", "sh-",
      "What data parallelism shards over the ranks: none (DDP: grads all-reduced in 25 MiB "
      "buckets), zero1 (+ optimizer state and fp32 master: DeepSpeed stage 1), zero2 (+ grads "
      "reduce-scattered: stage 2, FSDP SHARD_GRAD_OP), zero3 (+ weights, gathered per block: "
      "stage 3, FSDP FULL_SHARD); each parameter split in ceil(n / dp) parts; torch-zero1: "
      "torch's ZeroRedundancyOptimizer over DDP (whole parameters per rank, largest first to "
      "the least loaded; DDP's buckets and full grads)",
      &TrainConfig::sharding, sharding_name, parse_sharding, sharding_names);
  sharding.id_rule = IdRule::non_default;
  sharding.applies = [](const TrainConfig& c) { return c.data_parallel > 1; };
  t.push_back(std::move(sharding));

  // How torch.optim runs the update (models/train/optimizer.h): only the memory of the step
  // differs (its temporaries), never the update's arithmetic. Not where there is no optimizer
  // step on the device (eval; offload optimizer: ZeRO-Offload's host update, DeepSpeed's fused
  // CPU Adam).
  Knob impl = enum_knob(
      "optimizer_impl", "--optimizer-impl", "opt-",
      "How torch.optim (2.x) runs the update: foreach (_multi_tensor_*, PyTorch's CUDA default "
      "since 2.0: temporaries the size of the whole state, per parameter group and dtype), "
      "forloop (_single_tensor_*, its CPU default: one parameter's at a time) or fused "
      "(fused=True: none; not for rmsprop)",
      &TrainConfig::optimizer_impl, optimizer_impl_name, parse_optimizer_impl,
      optimizer_impl_names);
  impl.id_rule = IdRule::non_default;
  static constexpr auto steps_on_device = [](const TrainConfig& c) {
    return c.mode == Mode::train && c.offload != Offload::optimizer;
  };
  impl.applies = steps_on_device;
  impl.resolve = [](TrainConfig& c) -> std::optional<std::string> {
    if (steps_on_device(c) && c.optimizer_impl == OptimizerImpl::fused &&
        c.optimizer == OptimizerKind::rmsprop)
      return std::string(
          "fused with optimizer rmsprop: torch.optim.RMSprop has no fused implementation (torch "
          "2.x: adam, adamw, sgd and adagrad have one); use foreach or forloop");
    return std::nullopt;
  };
  // advise keeps it: which torch.optim code the predicted PyTorch run uses. Turning it would
  // always pick fused on memory, and memtrade's kernels (one fused update for all three) cannot
  // price foreach's or the for-loop's time.
  impl.cost = CostDriver::params;
  t.push_back(std::move(impl));
  // Tensor (and sequence) parallelism (kernels/parallel_state.h, models/layers/tensor_parallel.h):
  // the decoder's layers split over the tp ranks of a node. The split is the model's shape, so
  // a size the heads, the MLP or the vocabulary cannot take is refused by make_model.
  t.push_back(count_knob("tensor_parallel", "--tp", "tp",
                         "Tensor-parallel ranks per model replica (Megatron; GPT and Llama): qkv "
                         "and fc/gate/up split by columns (heads, KV heads too), the attention and "
                         "MLP output projections by rows and joined by an all-reduce, the "
                         "vocabulary of the embedding, head and cross-entropy split; ranks are "
                         "tp × dp, tp inside a node",
                         &TrainConfig::tensor_parallel, {"1", "2"}, 4096));
  t.back().id_rule = IdRule::non_default;
  t.back().applies = has_sequence;
  t.back().resolve = [](TrainConfig& c) -> std::optional<std::string> {
    if (c.tensor_parallel == 1) return std::nullopt;
    if (!has_sequence(c))
      return std::string("tensor parallelism splits a decoder's layers (GPT, Llama models)");
    if (c.offload == Offload::params)
      return std::string("offload params with tensor parallelism is not modelled");
    try {
      (void)make_model(c);  // heads, KV heads, MLP width: what the split cannot take
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::nullopt;
  };
  Knob sp = enum_knob("sequence_parallel", "--sequence-parallel", "sp-",
                      "Megatron's sequence parallelism with --tp > 1: the norms and residuals "
                      "(and the linears' saved inputs) split along the tokens, the row-parallel "
                      "all-reduce a reduce-scatter and the column-parallel input an all-gather",
                      &TrainConfig::sequence_parallel, sequence_parallel_name,
                      parse_sequence_parallel, sequence_parallel_names);
  sp.id_rule = IdRule::non_default;
  sp.applies = [](const TrainConfig& c) { return c.tensor_parallel > 1 && has_sequence(c); };
  sp.resolve = [](TrainConfig& c) -> std::optional<std::string> {
    if (c.sequence_parallel == SequenceParallel::off || c.tensor_parallel == 1) return std::nullopt;
    // The micro-batch's tokens split in equal parts over the tp ranks (models/layers/
    // tensor_parallel.h), as Megatron requires the sequence to divide by tp.
    const std::int64_t T = c.seq_len > 0 ? c.seq_len : max_seq_len_of(c);
    if (T > 0 && (c.batch_size * T) % c.tensor_parallel != 0)
      return fmt::format(
          "sequence parallelism splits the {} tokens of a micro-batch (batch_size {} × seq_len "
          "{}) over tp {}: they must be a multiple of it",
          c.batch_size * T, c.batch_size, T, c.tensor_parallel);
    return std::nullopt;
  };
  t.push_back(std::move(sp));
  // Expert parallelism (models/layers/moe.h, kernels/parallel_state.h): the experts split over
  // ep consecutive ranks of the data-parallel group. ep divides dp and the experts, and only a
  // model with experts takes it (make_model refuses the rest, naming the key).
  t.push_back(count_knob("expert_parallel", "--ep", "ep",
                         "Expert-parallel ranks (Megatron-core, DeepSpeed-MoE; mixture-of-experts "
                         "models): each MoE layer's experts split over ep consecutive ranks of "
                         "the data-parallel group, tokens dispatched to their experts' ranks and "
                         "back by all-to-all(v); expert grads reduced and sharded over the dp / ep "
                         "ranks holding the same experts",
                         // One example: ep 2 needs a model with experts and dp 2, which no
                         // single other axis of the knob walk's base config makes.
                         &TrainConfig::expert_parallel, {"1"}, 65536));
  t.back().id_rule = IdRule::non_default;
  t.back().applies = has_sequence;
  t.back().resolve = [](TrainConfig& c) -> std::optional<std::string> {
    if (c.expert_parallel == 1) return std::nullopt;
    if (c.data_parallel % c.expert_parallel != 0)
      return fmt::format(
          "expert_parallel {} must divide data_parallel {} (the experts split over ranks of the "
          "data-parallel group)",
          c.expert_parallel, c.data_parallel);
    if (c.sharding == Sharding::torch_zero1)
      return std::string(
          "expert parallelism with sharding torch-zero1 is not modelled: use none or zero1-3");
    try {
      (void)make_model(c);  // a model without experts, or experts that do not divide by ep
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::nullopt;
  };

  // What a Llama-like model's layers keep (models/families/llama.h): the fused kernels' saved
  // tensors, or HF's eager code's. Only the memory differs (and so the estimate): the arithmetic
  // is the same, bit for bit (tests/models/test_llama_layers.cpp).
  Knob layers = enum_knob(
      "llama_layers", "--llama-layers", "ll-",
      "What a Llama-like model's layers keep for backward: liger (what fused kernels keep: "
      "Liger-Kernel's RMSNorm and SwiGLU, RoPE in place, grouped-query attention without "
      "repeated K/V) or hf-eager (what HF transformers 4.46.3's eager code keeps under autograd: "
      "each RMSNorm's x² and normalised rows, SwiGLU's act(gate), repeat_kv's expanded K and V, "
      "and their temporaries)",
      &TrainConfig::llama_layers, llama_layers_name, parse_llama_layers, llama_layers_names);
  layers.id_rule = IdRule::non_default;
  static constexpr auto llama_like = [](const TrainConfig& c) {
    try {
      return std::holds_alternative<LlamaConfig>(model_desc_of(c)->family);
    } catch (const std::invalid_argument&) {
      return false;  // the model's own knobs say what is wrong
    }
  };
  layers.applies = llama_like;
  layers.resolve = [](TrainConfig& c) -> std::optional<std::string> {
    if (c.llama_layers == LlamaLayers::liger || llama_like(c)) return std::nullopt;
    return std::string(
        "hf-eager describes a Llama-like model's layers (llama-*, HF Llama-family configs)");
  };
  t.push_back(std::move(layers));

  for (Knob& k : t) {
    if (!k.id_text) k.id_text = k.get;
    if (!k.applies) k.applies = [](const TrainConfig&) { return true; };
    if (!k.resolve) k.resolve = [](TrainConfig&) { return std::optional<std::string>(); };
    if (!k.choices) k.choices = [] { return std::vector<std::string>{}; };
    if (!k.advise_values)
      k.advise_values = [choices = k.choices](const TrainConfig&) { return choices(); };
  }
  return t;
}

}  // namespace

std::vector<std::string> Knob::test_values() const {
  auto c = choices();
  return c.empty() ? examples : c;
}

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = make_table();
  return table;
}

const Knob* find_knob(std::string_view name) {
  for (const Knob& k : knobs())
    if (k.name == name) return &k;
  return nullptr;
}

const Knob& knob(std::string_view name) {
  const Knob* k = find_knob(name);
  if (k == nullptr)
    throw std::invalid_argument(
        fmt::format("unknown axis '{}' ({})", name, expected(knob_names())));
  return *k;
}

std::vector<std::string> knob_names() {
  std::vector<std::string> out;
  for (const Knob& k : knobs()) out.push_back(k.name);
  return out;
}

void set_knob(TrainConfig& cfg, const Knob& k, std::string_view text) {
  if (auto err = k.set(cfg, text)) throw KnobError(fmt::format("{}: {}", k.name, *err));
}

void resolve_config(TrainConfig& cfg) {
  // The model, resolved once for the rows below (their resolves and applies build it) and for
  // every copy of the config; one that cannot be resolved or built is refused by those rows, as
  // ever. Checked as the knobs check theirs, so that a knob finding it set takes it as checked.
  try {
    auto d = model_desc_of(cfg);
    if (d != cfg.model_desc) (void)make_model(*d, TrainConfig{});
    cfg.model_desc = std::move(d);
  } catch (const std::invalid_argument&) {
    cfg.model_desc = nullptr;
  }
  for (const Knob& k : knobs())
    if (auto err = k.resolve(cfg)) throw KnobError(fmt::format("{}: {}", k.name, *err));
  // An axis that does not apply (the autocast policy of fp32, the attention kind of an MLP)
  // takes its default: one configuration, one config, one id.
  for (const Knob& k : knobs())
    if (!k.applies(cfg)) set_knob(cfg, k, k.default_text());
}

std::string point_id(const TrainConfig& c) {
  std::string id;
  for (const Knob& k : knobs()) {
    if (k.id_rule != IdRule::always && !k.applies(c)) continue;
    if (k.id_rule == IdRule::non_default && k.get(c) == k.default_text()) continue;
    if (!id.empty()) id += '/';
    id += k.id_prefix + k.id_text(c);
  }
  return id;
}

nlohmann::json config_json(const TrainConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const Knob& k : knobs()) {
    const std::string v = k.get(c);
    if (k.type == KnobType::integer)
      j[k.name] = std::stoll(v);
    else
      j[k.name] = v;
  }
  j["seed"] = c.seed;
  return j;
}

nlohmann::json config_json(const TrainConfig& c, const Model& model) {
  nlohmann::json j = config_json(c);
  j["hyper"] = model.hyper();
  return j;
}

TrainConfig config_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw KnobError("config: expected an object");
  TrainConfig c;
  for (const Knob& k : knobs()) {
    if (!j.contains(k.name)) continue;
    const nlohmann::json& v = j.at(k.name);
    std::string text;
    if (v.is_string() && k.type != KnobType::integer) {
      text = v.get<std::string>();
    } else if (v.is_number_integer() && k.type != KnobType::text) {
      text = v.dump();
    } else if (v.is_number() && k.type == KnobType::density) {
      text = fmt::format("{}", v.get<double>());  // step dumps before 0.2 wrote a number
    } else {
      throw KnobError(fmt::format("config.{}: expected {}, got {}", k.name,
                                  k.type == KnobType::integer ? "an integer" : "a string",
                                  v.dump()));
    }
    set_knob(c, k, text);
  }
  if (j.contains("seed")) {
    if (!j.at("seed").is_number_unsigned() && !j.at("seed").is_number_integer())
      throw KnobError("config.seed: expected an integer");
    c.seed = j.at("seed").get<std::uint64_t>();
  }
  resolve_config(c);
  return c;
}

nlohmann::json knobs_json() {
  nlohmann::json out = nlohmann::json::array();
  static constexpr const char* kTypes[] = {"integer", "text", "density"};
  static constexpr const char* kIdRules[] = {"always", "non_default", "when_applies"};
  static constexpr const char* kAdvise[] = {"keep", "turn", "allow"};
  for (const Knob& k : knobs()) {
    const auto choices = k.choices();
    const std::string def = k.default_text();
    nlohmann::json row = {
        {"name", k.name},
        {"flag", k.flag},
        {"id_prefix", k.id_prefix},
        {"id_rule", kIdRules[static_cast<int>(k.id_rule)]},
        {"type", kTypes[static_cast<int>(k.type)]},
        {"workload", k.workload},
        {"advise", kAdvise[static_cast<int>(k.advise)]},
        {"default",
         k.type == KnobType::integer ? nlohmann::json(std::stoll(def)) : nlohmann::json(def)},
        {"choices", choices.empty() ? nlohmann::json(nullptr) : nlohmann::json(choices)},
        {"examples", k.test_values()},
        {"values", choices.empty() ? k.values_text : fmt::format("{}", fmt::join(choices, " | "))},
        {"help", k.help}};
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace memtrade
