"""One memtrade point in PyTorch eager on the CPU: same model, shapes, batch and optimizer.

Prints one JSON line: {"model", "batch_size", "samples_s": [...], "median_s"}.
The model's hyper-parameters come from a memtrade step dump's meta.json, so the shapes are
memtrade's by construction.
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import torch_models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meta", required=True, help="meta.json of a memtrade step dump")
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    meta = json.loads(pathlib.Path(args.meta).read_text())
    family = meta["config"]["model"].split("-")[0]
    hyper = meta["hyper"]
    model = torch_models.build(family, hyper)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    dump = pathlib.Path(args.meta).parent
    inputs = torch.from_numpy(np.load(dump / "inputs.npy"))
    targets = torch.from_numpy(np.load(dump / "targets.npy")).long()
    reps = (args.batch_size + inputs.shape[0] - 1) // inputs.shape[0]
    inputs = inputs.repeat((reps,) + (1,) * (inputs.dim() - 1))[: args.batch_size]
    targets = targets.repeat((reps,) + (1,) * (targets.dim() - 1))[: args.batch_size]
    inputs = inputs.long() if inputs.dtype == torch.int32 else inputs.float()

    samples = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()
        opt.step()
        float(loss)  # read back, as memtrade does
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            samples.append(dt)
    print(json.dumps({"model": meta["config"]["model"], "batch_size": args.batch_size,
                      "samples_s": samples, "median_s": statistics.median(samples),
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
