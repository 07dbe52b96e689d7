// The step dump (`memtrade step ... --dump DIR`): one optimizer step, written as NumPy files so
// that PyTorch (tests/python/test_torch_reference.py) can redo it from the same numbers.
//
//   DIR/inputs.npy               whole effective batch (B·k samples): GPT int32 (B·k, T),
//                                MLP float32 (B·k, in), CNN float32 (B·k, C, H, W)
//   DIR/targets.npy              int32 class ids, target_shape(B·k)
//   DIR/loss.npy                 float32, shape (): mean loss over the effective batch
//   DIR/params/<name>.npy        trainable parameters before the step, fp32 (master if any)
//   DIR/grads/<name>.npy         grads of the mean loss over the effective batch, after
//                                accumulation and unscaling, fp32 (inf/nan kept when an fp16
//                                step overflowed and was skipped)
//   DIR/params_after/<name>.npy  trainable parameters after the step, fp32
//   DIR/meta.json                {"schema": "memtrade.step/1", "config": config_json (every
//                                axis, seed), the keys of resolved_json ("lr",
//                                "optimizer_hyper", "checkpoint_plan", "loss_scale_init",
//                                "loss_scale_growth_interval"),
//                                "hyper": model.hyper(), "params": [names in order],
//                                "shapes": {name: shape}, "loss",
//                                "loss_scale", "skipped", "device", "backend"}
//
// Only trainable parameters are written (batch-norm running stats are buffers); GPT's head is
// tied to transformer.wte.weight and not written twice. In eval mode there are no grads and no
// update: grads/ and params_after/ are not written.
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

#include "kernels/device.h"
#include "models/config/config.h"
#include "models/model.h"
#include "models/train/saved_tensors.h"

namespace memtrade {

// Runs ONE step of a fresh Trainer(dev, model, cfg) and writes the files above (creating DIR).
// With `init` (`step --init DIR`), the trainable parameters start from DIR/<name>.npy instead of
// the seed's init: every one, with its shape, and no other .npy (a dump's params/ or
// params_after/, or a reference's own weights: HF's, with non-zero biases). BadInput otherwise.
// Throws std::runtime_error when a file cannot be written.
// Data parallelism: every rank runs it (the gathers are collectives); rank 0 writes the whole
// model's files, as dp 1 would, with the global batch's inputs, and returns true; the other
// ranks return false.
bool write_step_dump(Device& dev, Model& model, const TrainConfig& cfg,
                     const std::filesystem::path& dir, const std::filesystem::path& init = {});

// What memtrade resolves from a config before it runs it, so that a peer (bench/peers/) runs the
// same training without re-implementing memtrade's rules: {"lr": the effective learning rate,
// "optimizer_hyper": {...}, "checkpoint_plan": {"selective": bool, "segments": [[begin, end,
// recompute], ...]} (models/train/saved_tensors.h CheckpointPlan), "loss_scale_init",
// "loss_scale_growth_interval"}. In the dump's meta.json and in `run --list --json`.
nlohmann::json resolved_json(const TrainConfig& cfg, const Model& model);
// meta.json's "optimizer_hyper": the OptimizerHyper fields by their torch.optim names.
nlohmann::json optimizer_hyper_json(const OptimizerHyper& h);

}  // namespace memtrade
