// ModelDesc: a model resolved once. A model value ("llama-tiny:n_layer=4") names a row of the size
// table with its overrides applied; a Hugging Face config.json (models/config/hf_config.h) is read,
// hashed and parsed. Either way the result is one family config, immutable and shared: the
// TrainConfig that names the model carries it (TrainConfig::model_desc), and make_model shapes it
// per point (seq_len, tensor-parallel rank) without resolving the model again.
#pragma once

#include <string>
#include <variant>

#include "models/config/config.h"
#include "models/families/cnn.h"
#include "models/families/gpt.h"
#include "models/families/llama.h"
#include "models/families/mlp.h"

namespace memtrade {

using FamilyConfig = std::variant<GptConfig, LlamaConfig, MlpConfig, CnnConfig>;

struct ModelDesc {
  std::string model;         // the canonical model value; "" where a file defines the model
  std::string model_config;  // the config.json's path as given; "" for a size-table model
  std::string sha256;        // the SHA-256 of the file's bytes, read with them
  FamilyConfig family;       // its own seq_len, the whole model (no tp split)

  // Whether this is the model `cfg` names: its model value (cfg.model in canonical text) where
  // cfg has no model config, else the same file with the same hash (a cfg without one takes the
  // file's).
  bool describes(const TrainConfig& cfg) const {
    if (cfg.model_config.empty()) return model_config.empty() && cfg.model == model;
    return cfg.model_config == model_config &&
           (cfg.model_config_sha256.empty() || cfg.model_config_sha256 == sha256);
  }
};

}  // namespace memtrade
