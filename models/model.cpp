// make_model and the size table of every family.
#include <functional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/cnn.h"
#include "models/gpt.h"
#include "models/mlp.h"

namespace memtrade {
namespace {

// What a row is built with besides its size: the knobs that shape the model.
struct Shaping {
  std::int64_t seq_len = 0;  // 0: the model's own
};

struct SizeRow {
  std::string_view name;
  bool listed;  // hidden rows (test sizes) are made by make_model but not listed
  std::function<std::unique_ptr<Model>(const Shaping&)> make;
};

std::unique_ptr<Model> gpt(std::string_view name, int n_layer, int n_head, int n_embd, int vocab,
                           int block_size, const Shaping& s) {
  return std::make_unique<GptModel>(GptConfig{std::string(name), n_layer, n_head, n_embd, vocab,
                                              block_size, static_cast<int>(s.seq_len)});
}

std::unique_ptr<Model> mlp(std::string_view name, int in, std::vector<int> hidden, int classes) {
  return std::make_unique<MlpModel>(MlpConfig{std::string(name), in, std::move(hidden), classes});
}

std::unique_ptr<Model> cnn(std::string_view name, int size, int classes, int stem,
                           std::vector<CnnConfig::BlockSpec> blocks) {
  return std::make_unique<CnnModel>(
      CnnConfig{std::string(name), size, classes, stem, std::move(blocks)});
}

const std::vector<SizeRow>& size_table() {
  static const std::vector<SizeRow> table = {
      // GPT: n_layer, n_head, n_embd, vocab, block_size (= training sequence length).
      {"gpt-test", false, [](const Shaping& s) { return gpt("gpt-test", 2, 2, 8, 11, 5, s); }},
      {"gpt-tiny", true, [](const Shaping& s) { return gpt("gpt-tiny", 2, 2, 64, 256, 32, s); }},
      {"gpt-mini", true, [](const Shaping& s) { return gpt("gpt-mini", 4, 4, 128, 512, 64, s); }},
      {"gpt-small", true,
       [](const Shaping& s) { return gpt("gpt-small", 6, 6, 384, 8192, 256, s); }},
      {"gpt2-124m", true,
       [](const Shaping& s) { return gpt("gpt2-124m", 12, 12, 768, 50257, 1024, s); }},
      {"gpt2-350m", true,
       [](const Shaping& s) { return gpt("gpt2-350m", 24, 16, 1024, 50257, 1024, s); }},
      {"gpt2-774m", true,
       [](const Shaping& s) { return gpt("gpt2-774m", 36, 20, 1280, 50257, 1024, s); }},
      {"gpt2-1558m", true,
       [](const Shaping& s) { return gpt("gpt2-1558m", 48, 25, 1600, 50257, 1024, s); }},
      // MLP: in_features, hidden widths, classes.
      {"mlp-test", false,
       [](const Shaping&) {
         return mlp("mlp-test", 6, {5, 4}, 3);
       }},
      {"mlp-tiny", true,
       [](const Shaping&) {
         return mlp("mlp-tiny", 32, {64, 64}, 10);
       }},
      {"mlp-small", true,
       [](const Shaping&) {
         return mlp("mlp-small", 256, {1024, 1024, 1024}, 100);
       }},
      {"mlp-large", true,
       [](const Shaping&) {
         return mlp("mlp-large", 1024, {4096, 4096, 4096, 4096}, 1000);
       }},
      // CNN: image size, classes, stem channels, blocks (channels, stride).
      {"cnn-test", false,
       [](const Shaping&) {
         return cnn("cnn-test", 8, 3, 4, {{4, 1}, {6, 2}});
       }},
      {"cnn-tiny", true,
       [](const Shaping&) {
         return cnn("cnn-tiny", 16, 10, 8, {{8, 1}, {16, 2}});
       }},
      {"cnn-small", true,
       [](const Shaping&) {
         return cnn("cnn-small", 32, 100, 32, {{32, 1}, {64, 2}, {128, 2}, {128, 1}});
       }},
  };
  return table;
}

}  // namespace

std::unique_ptr<Model> make_model(std::string_view name) {
  for (const auto& row : size_table())
    if (row.name == name) return row.make(Shaping{});
  throw std::invalid_argument(
      fmt::format("unknown model '{}' (known: {})", name, fmt::join(model_names(), ", ")));
}

std::unique_ptr<Model> make_model(const TrainConfig& cfg) {
  for (const auto& row : size_table()) {
    if (row.name != cfg.model) continue;
    if (cfg.seq_len != 0 && row.make(Shaping{})->max_seq_len() == 0)
      throw std::invalid_argument(
          fmt::format("seq_len: {} has no sequence length (a GPT-style model has)", cfg.model));
    return row.make(Shaping{cfg.seq_len});
  }
  return make_model(cfg.model);  // throws: unknown model
}

std::vector<std::string> model_names() {
  std::vector<std::string> out;
  for (const auto& row : size_table())
    if (row.listed) out.emplace_back(row.name);
  return out;
}

std::shared_ptr<Tensor> ParamStore::weight_cast(int index, DType dtype, Ops& ops) {
  Tensor& w = weight(index);
  if (w.dtype() == dtype) return std::shared_ptr<Tensor>(std::shared_ptr<Tensor>{}, &w);
  std::shared_ptr<Tensor>& cast = casts_[index];
  if (!cast) {
    cast = std::make_shared<Tensor>(*w.allocator(), w.shape(), dtype, Category::casts);
    ops.cast(*cast, w);
  } else if (cast->dtype() != dtype) {
    throw std::logic_error(fmt::format("weight {} cast to {} and to {} in one autocast region",
                                       index, dtype_name(cast->dtype()), dtype_name(dtype)));
  }
  return cast;
}

RunOptions RunOptions::from(const TrainConfig& cfg) {
  RunOptions o;
  o.act_dtype = compute_dtype(cfg.precision);
  o.training = cfg.mode == Mode::train;
  o.checkpoint = cfg.checkpoint;
  o.offload_activations = cfg.offload == Offload::activations;
  o.attention = cfg.attention;
  if (auto dt = autocast_dtype(cfg.precision)) o.amp = AutocastSpec{*dt, cfg.autocast_policy};
  return o;
}

std::int64_t Model::num_params() const {
  std::int64_t total = 0;
  for (const auto& p : params())
    if (p.trainable) total += shape_numel(p.shape);
  return total;
}

}  // namespace memtrade
