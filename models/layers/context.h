// LayerCtx: what a layer's forward/backward needs besides its tensors — the device, the weights
// and gradients (ParamStore), where to save for backward (SavedTensors) and how.
#pragma once

#include <string_view>

#include "kernels/device.h"
#include "models/model.h"
#include "models/saved_tensors.h"

namespace memtrade {

struct LayerCtx {
  Device& dev;
  ParamStore& store;
  SavedTensors& saved;
  DType act = DType::F32;  // dtype of activations and of activation gradients
  int segment = -1;        // SavedTensors segment: the block index, -1 stem, num_blocks head
  bool save = false;       // keep what backward needs (training, block not dropped)
  bool selective = false;  // skip saving what is cheap to recompute (selective checkpointing)
  bool recompute = false;  // re-running a forward for backward: no side effects (BN stats)
  AttentionKind attention = AttentionKind::math;  // RunOptions::attention

  Ops& ops() { return dev.ops(); }
  Tensor& weight(int index) { return store.weight(index); }

  // Saved for backward when `save`, else freed within the forward.
  Category cat() const { return save ? Category::activations : Category::temporaries; }
  // An activation-dtype tensor that will be saved if this forward saves.
  Tensor act_tensor(Shape shape) { return dev.empty(std::move(shape), act, cat()); }
  // A buffer that never outlives the current forward/backward step of a layer.
  Tensor temp(Shape shape, DType dtype) {
    return dev.empty(std::move(shape), dtype, Category::temporaries);
  }
  Tensor temp(Shape shape) { return temp(std::move(shape), act); }

  void keep(std::string_view key, Tensor t) {
    if (save) saved.save(segment, key, std::move(t));
  }
  Tensor& get(std::string_view key) { return saved.get(segment, key); }
  bool has(std::string_view key) const { return saved.has(segment, key); }
};

// A parameter's index in Model::params(), -1 when absent (a Linear without bias).
using ParamIndex = int;

}  // namespace memtrade
