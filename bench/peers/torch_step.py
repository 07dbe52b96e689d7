#!/usr/bin/env python3
"""memtrade's grid points in PyTorch eager: the peer that memtrade's numbers are judged against.

    torch_step.py --points RESULTS.json   --memtrade BIN --out torch.json [--device cuda|cpu]
    torch_step.py --grid FILE.toml        --memtrade BIN --out torch.json [--device cuda|cpu]
    torch_step.py --model M --batch-size B [--precision P] [--autocast-policy A]
                  [--checkpoint C] [--optimizer O]
                  [--offload O] [--zero-grad Z] [--mode M] [--accumulation K] [--empty-cache E]
                  [--input I] [--seed S]  --memtrade BIN --out torch.json
    common: [--warmup W] [--steps S] [--timeout SECONDS] [--threads N] [--in-process]

--points takes every point (id and config, hyper-parameters included) from a memtrade results
file, so the peer runs exactly memtrade's points; --grid and the knob flags ask
`BIN run ... --list` for the point ids (so [[exclude]]/[[where]] mean what they mean to memtrade).
A config without "hyper" gets it from `BIN step --model M --batch-size 1 --backend cpu --dump`.

The output is a memtrade results file (schema memtrade.results/1) with meta.peer =
"pytorch-eager" and memtrade's point ids, so `memtrade compare torch.json memtrade.json` and the
reports put the two side by side. Each point runs in its own Python process (as memtrade runs
each in its own child), so the CUDA caching allocator's peaks never leak between points.

How each knob maps onto PyTorch eager:
  precision   fp32: plain fp32, TF32 off for matmul and cuDNN; tf32: both on (CUDA only);
              fp16 / bf16: torch.autocast (fp32 weights = the master copy), fp16 with GradScaler
              (init 2^16, growth x2 every 2000 steps, back-off x0.5, as memtrade), on the
              device's own op lists: memtrade's autocast_policy must name that device;
              fp16-o2 / bf16-o2 (16-bit weights, fp32 master) have no eager counterpart;
              fp16-pure / bf16-pure: model.half() / .bfloat16(); fp16-pure keeps memtrade's
              dynamic loss scaling by hand (GradScaler refuses fp16 gradients).
  checkpoint  torch.utils.checkpoint (non-reentrant) on memtrade's plan: density d recomputes
              round(d*n) evenly spaced blocks, sqrt recomputes segments of ceil(sqrt(n)) blocks;
              selective has no eager equivalent -> skipped.
  offload     activations: torch.autograd.graph.save_on_cpu(pin_memory=True); optimizer and
              params have no eager equivalent -> skipped.
  zero_grad   optimizer.zero_grad(set_to_none=...) after every step (grads of set_to_none are
              freed before the next forward; zero keeps them resident, zero-filled).
  mode        eval: model.eval() + torch.no_grad(), forward only, no optimizer.
  empty_cache per_step: torch.cuda.empty_cache() at the end of every step.
  input       pinned: pin_memory() host batches copied with non_blocking=True; pageable: plain.
  accumulation k micro-batches of batch_size, each loss / k, one optimizer step.
Time: CUDA events around each whole step (input copy .. loss read-back .. empty_cache) on the
current stream; perf_counter on the CPU. Memory: peaks of torch.cuda's caching allocator after
reset_peak_memory_stats() at the end of warm-up (null on the CPU); device_peak is the largest
cudaMemGetInfo used-bytes seen after a measured step, as memtrade's.
Exit: 0 all points written (ok/oom/skipped are results), 1 some point errored or timed out,
2 bad input.
"""
import argparse
import datetime
import json
import math
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent

AXES = ["model", "batch_size", "accumulation", "precision", "checkpoint", "optimizer", "offload",
        "zero_grad", "mode", "empty_cache", "input"]
DEFAULTS = {"model": "mlp-tiny", "batch_size": 8, "accumulation": 1, "precision": "fp32",
            "checkpoint": "0", "optimizer": "adam", "offload": "none",
            "zero_grad": "set_to_none", "mode": "train", "empty_cache": "never",
            "input": "pinned"}


class BadInput(Exception):
    pass


# ---- points ---------------------------------------------------------------------------------

def parse_id(pid, seed=0):
    """memtrade's point id -> config (models/knobs.cpp point_id, inverted): 11 fields, or 12 with
    the autocast policy ("ac-torch-cuda") after an autocast precision."""
    parts = pid.split("/")
    policy = {}
    if len(parts) == 12 and parts[4].startswith("ac-"):
        policy = {"autocast_policy": parts.pop(4)[len("ac-"):]}
    if len(parts) != 11:
        raise BadInput(f"cannot parse point id {pid!r} (expected 11 '/'-separated fields, 12 "
                       f"with an autocast policy)")
    model, b, a, prec, ck, opt, off, zg, mode, ec, inp = parts

    def strip(s, prefix):
        if not s.startswith(prefix):
            raise BadInput(f"point id {pid!r}: field {s!r} does not start with {prefix!r}")
        return s[len(prefix):]

    try:
        return {"model": model, "batch_size": int(strip(b, "b")),
                "accumulation": int(strip(a, "a")), "precision": prec,
                "checkpoint": strip(ck, "ck"), "optimizer": opt, "offload": strip(off, "off-"),
                "zero_grad": strip(zg, "zg-"), "mode": mode, "empty_cache": strip(ec, "ec-"),
                "input": strip(inp, "in-"), "seed": seed, **policy}
    except ValueError as e:
        raise BadInput(f"point id {pid!r}: {e}") from None


def run_bin(args, what):
    try:
        res = subprocess.run(args, capture_output=True, text=True)
    except OSError as e:
        raise BadInput(f"cannot run {args[0]}: {e}") from None
    if res.returncode != 0:
        msg = (res.stderr.strip() or res.stdout.strip()).splitlines()
        raise BadInput(f"{what} failed (exit {res.returncode}): {msg[-1] if msg else ''}")
    return res.stdout


def points_from_results(path):
    try:
        doc = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: cannot read results: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != "memtrade.results/1":
        raise BadInput(f"{path}: not a memtrade results file (schema memtrade.results/1)")
    pts = []
    for p in doc.get("points") or []:
        if not isinstance(p, dict) or not isinstance(p.get("id"), str):
            raise BadInput(f"{path}: a point has no string id")
        cfg = p.get("config") if isinstance(p.get("config"), dict) else parse_id(p["id"])
        pts.append({"id": p["id"], "config": cfg, "ref": p})
    meta = doc.get("meta") or {}
    return pts, {"grid": meta.get("grid"), "grid_hash": meta.get("grid_hash"),
                 "capacity": meta.get("capacity")}


def points_from_list(binary, list_args, seed):
    out = run_bin([binary, "run", *list_args, "--list", "--json"], "memtrade run --list --json")
    try:
        listed = json.loads(out)["points"]
    except (ValueError, KeyError, TypeError) as e:
        raise BadInput(f"memtrade run --list --json: unexpected output ({e})") from None
    return [{"id": p["id"], "config": {**p["config"], "seed": seed}, "ref": None}
            for p in listed]


def grid_settings(path):
    """[run] warmup/steps/seed and the name of a grid file (tomllib: Python >= 3.11)."""
    try:
        import tomllib
    except ImportError:
        return {}
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: {e}") from None
    run = doc.get("run", {})
    return {"name": doc.get("name"), "warmup": run.get("warmup"), "steps": run.get("steps"),
            "seed": run.get("seed", 0), "timeout": run.get("timeout")}


def hyper_for(binary, model, cache, tmp):
    if model not in cache:
        d = pathlib.Path(tmp) / f"dump-{model}"
        # Cheapest step that writes meta.json: the hyper-parameters do not depend on the knobs.
        run_bin([binary, "step", "--model", model, "--batch-size", "1", "--backend", "cpu",
                 "--optimizer", "sgd", "--precision", "fp32", "--dump", str(d)],
                f"memtrade step --model {model} --dump")
        cache[model] = json.loads((d / "meta.json").read_text())["hyper"]
    return cache[model]


def family_of(model):
    for f in ("gpt", "mlp", "cnn"):
        if model.startswith(f):
            return f
    return model.split("-")[0]


def skip_reason(cfg, device):
    """Knob settings PyTorch eager has no counterpart for (the point becomes a 'skipped' row)."""
    ck, off, prec = str(cfg.get("checkpoint")), cfg.get("offload"), cfg.get("precision")
    if ck == "selective":
        return ("checkpoint=selective: PyTorch eager has no selective recomputation "
                "(torch.utils.checkpoint drops whole regions)")
    if off == "optimizer":
        return "offload=optimizer: no ZeRO-Offload equivalent in PyTorch eager"
    if off == "params":
        return "offload=params: no parameter streaming in PyTorch eager"
    if device != "cuda" and prec == "tf32":
        return "precision=tf32 is a CUDA tensor-core format"
    if device != "cuda" and prec == "fp16":
        return "precision=fp16 (autocast + GradScaler) needs CUDA"
    if prec in ("fp16-o2", "bf16-o2"):
        return (f"precision={prec}: O2 mixed precision (16-bit weights and activations, fp32 "
                f"master) has no PyTorch eager counterpart")
    policy = cfg.get("autocast_policy", "torch-cuda")
    if prec in ("fp16", "bf16") and policy != f"torch-{device}":
        return (f"autocast_policy={policy}: torch.autocast on {device} follows PyTorch's "
                f"{device} lists (memtrade's torch-{device} policy)")
    if device != "cuda" and prec == "fp16-pure":
        return "precision=fp16-pure: PyTorch's CPU kernels lack fp16 (LayerNorm, addmm)"
    return None


# ---- one point (runs in the child process) --------------------------------------------------

def quantile(xs, q):
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def cv(xs):
    if len(xs) < 2:
        return 0.0
    m = statistics.fmean(xs)
    return statistics.stdev(xs) / m if m else 0.0


def checkpoint_plan(ck, n):
    """memtrade's CheckpointPlan::make (models/saved_tensors.cpp): [(begin, end, recompute)]."""
    if ck == "sqrt":
        s = max(1, math.ceil(math.sqrt(n)))
        return [(b, min(n, b + s), True) for b in range(0, n, s)]
    d = float(ck)
    if not 0.0 <= d <= 1.0:
        raise BadInput(f"checkpoint density {d} not in [0, 1]")
    k = int(math.floor(d * n + 0.5))  # lround, d*n >= 0
    return [(i, i + 1, (i + 1) * k // n > i * k // n) for i in range(n)]


def init_like_memtrade(torch, model, family, hyper):
    """GPT: nanoGPT's init (N(0, 0.02), residual projections 0.02/sqrt(2L), zero biases), as
    memtrade's models/gpt.cpp. MLP/CNN keep PyTorch's defaults, which memtrade mirrors."""
    if family != "gpt":
        return
    proj = 0.02 / math.sqrt(2 * hyper["n_layer"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif name.endswith("c_proj.weight"):
                p.normal_(0.0, proj)
            elif "ln_" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)


def make_optimizer(torch, name, family, params):
    mlp = family == "mlp"
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=3e-3 if mlp else 1e-3)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=3e-3 if mlp else 1e-3)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=1e-2)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-2)
    raise BadInput(f"unknown optimizer {name!r}")


def grad_scaler(torch):
    kw = dict(init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000)
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
        try:
            return torch.amp.GradScaler("cuda", **kw)
        except TypeError:
            pass
    return torch.cuda.amp.GradScaler(**kw)


def is_oom(torch, e):
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(e, oom_type):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def run_point(spec):
    """One point, in this process: returns the result row (without id/config)."""
    import contextlib

    import torch

    sys.path.insert(0, str(HERE))
    import torch_models

    cfg, hyper = spec["config"], spec["hyper"]
    warmup, steps = spec["warmup"], spec["steps"]
    dev = torch.device(spec["device"])
    cuda = dev.type == "cuda"
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    family = family_of(cfg["model"])
    B, k = int(cfg["batch_size"]), int(cfg.get("accumulation", 1))
    prec = cfg["precision"]
    train = cfg.get("mode", "train") == "train"
    pinned = cfg.get("input", "pinned") == "pinned" and cuda
    seed = int(cfg.get("seed", 0))

    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        torch.backends.cudnn.allow_tf32 = prec == "tf32"
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(prec)
    param_dtype = {"fp16-pure": torch.float16, "bf16-pure": torch.bfloat16}.get(prec,
                                                                               torch.float32)

    torch.manual_seed(seed)
    model = torch_models.build(family, hyper)
    init_like_memtrade(torch, model, family, hyper)
    model = model.to(device=dev, dtype=param_dtype)  # the tied head stays tied
    model.train(train)
    n_blocks = len(torch_models.parts(model)[1])
    plan = checkpoint_plan(str(cfg.get("checkpoint", "0")), n_blocks) if train else \
        [(0, n_blocks, False)]

    def forward(x, t):
        return torch_models.plan_forward(model, plan, x, t)

    # Data: seeded random micro-batches on the host (fresh ones every step, as memtrade's data
    # stream: a model that saw the same batch twice would drift from memtrade's loss), copied to
    # the device inside every step.
    g = torch.Generator().manual_seed(seed)

    def micro_batch():
        if family == "gpt":
            T = int(hyper.get("seq_len", hyper["block_size"]))
            x = torch.randint(0, hyper["vocab_size"], (B, T), generator=g)  # (B, T)
            t = torch.randint(0, hyper["vocab_size"], (B, T), generator=g)  # (B, T)
        elif family == "mlp":
            x = torch.randn(B, hyper["in_features"], generator=g)  # (B, F)
            t = torch.randint(0, hyper["classes"], (B,), generator=g)  # (B,)
        else:
            s = hyper["image_size"]
            x = torch.randn(B, hyper["in_channels"], s, s, generator=g)  # (B, C, H, W)
            t = torch.randint(0, hyper["classes"], (B,), generator=g)  # (B,)
        return (x.pin_memory(), t.pin_memory()) if pinned else (x, t)

    batches = [[micro_batch() for _ in range(k)] for _ in range(min(warmup + steps, 64))]
    input_bytes = sum(x.numel() * x.element_size() + t.numel() * t.element_size()
                      for x, t in batches[0])  # one step's worth
    tokens_per_sample = int(hyper.get("seq_len", hyper.get("block_size", 1))) \
        if family == "gpt" else 1

    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(torch, cfg["optimizer"], family, params) if train else None
    scaler = grad_scaler(torch) if (train and prec == "fp16" and cuda) else None
    manual_scale = [2.0 ** 16, 0]  # fp16-pure: [scale, clean steps since the last change]
    use_manual = train and prec == "fp16-pure"
    set_to_none = cfg.get("zero_grad", "set_to_none") == "set_to_none"
    offload = train and cfg.get("offload", "none") == "activations"
    per_step_empty = cuda and cfg.get("empty_cache", "never") == "per_step"

    def context():
        stack = contextlib.ExitStack()
        if not train:
            stack.enter_context(torch.no_grad())
        if amp_dtype is not None:
            stack.enter_context(torch.autocast(device_type=dev.type, dtype=amp_dtype))
        if offload:
            stack.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=cuda))
        return stack

    def step(host):
        """One optimizer step over `host`'s micro-batches; returns (mean loss, skipped)."""
        total = None
        for x_host, t_host in host:
            x = x_host.to(dev, non_blocking=pinned)
            t = t_host.to(dev, non_blocking=pinned)
            if x.is_floating_point() and param_dtype != torch.float32:
                x = x.to(param_dtype)
            with context():
                loss = forward(x, t)
            if train:
                part = loss.float() / k
                if scaler is not None:
                    scaler.scale(part).backward()
                elif use_manual:
                    (part * manual_scale[0]).backward()
                else:
                    part.backward()
            lf = loss.detach().float()
            total = lf if total is None else total + lf
            del loss, x, t
        value = total.item() / k  # the step's one read-back (synchronises)
        skipped = False
        if train:
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            elif use_manual:
                grads = [p.grad for p in params if p.grad is not None]
                s = torch.stack([gr.sum(dtype=torch.float32) for gr in grads]).sum()
                if math.isfinite(s.item()):
                    torch._foreach_mul_(grads, 1.0 / manual_scale[0])
                    opt.step()
                    manual_scale[1] += 1
                    if manual_scale[1] >= 2000:
                        manual_scale[0] *= 2.0
                        manual_scale[1] = 0
                else:
                    skipped = True
                    manual_scale[0] *= 0.5
                    manual_scale[1] = 0
            else:
                opt.step()
            opt.zero_grad(set_to_none=set_to_none)
        if per_step_empty:
            torch.cuda.empty_cache()
        return value, skipped

    if cuda:
        ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
    samples, losses, skipped_steps, device_peak = [], [], 0, None
    last_scale = scaler.get_scale() if scaler is not None else None
    if train:
        opt.zero_grad(set_to_none=set_to_none)
    for i in range(warmup + steps):
        measured = i >= warmup
        if measured and i == warmup and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            ev[0].record()
            loss, skipped = step(batches[i % len(batches)])
            ev[1].record()
            ev[1].synchronize()
            dt = ev[0].elapsed_time(ev[1]) / 1e3
        else:
            t0 = time.perf_counter()
            loss, skipped = step(batches[i % len(batches)])
            dt = time.perf_counter() - t0
        if scaler is not None:  # outside the timed region: get_scale() synchronises
            scale = scaler.get_scale()
            skipped = skipped or scale < last_scale
            last_scale = scale
        if not measured:
            continue
        samples.append(dt)
        losses.append(loss)
        skipped_steps += int(skipped)
        if cuda:
            free, total = torch.cuda.mem_get_info()
            device_peak = max(device_peak or 0, total - free)

    med = statistics.median(samples)
    memory = {"peak_allocated": None, "peak_requested": None, "peak_reserved": None,
              "breakdown_at_peak": None, "predicted_peak": None, "device_peak": device_peak,
              "host_pinned_peak": (input_bytes * len(batches) if pinned else 0) if not offload else None}
    if cuda:
        stats = torch.cuda.memory_stats()
        memory["peak_allocated"] = int(torch.cuda.max_memory_allocated())
        memory["peak_reserved"] = int(torch.cuda.max_memory_reserved())
        req = stats.get("requested_bytes.all.peak")  # torch >= 2.0
        memory["peak_requested"] = int(req) if req is not None else None
    samples_per_step = B * k
    ref = spec.get("ref") or {}
    ref_tp = ref.get("throughput") or {}
    ref_med = (ref.get("time") or {}).get("median_s")
    flops = ref_tp.get("flops_per_step")  # the same work as memtrade's point: same definition
    mfu = None
    if ref_tp.get("mfu") is not None and ref_med:
        mfu = ref_tp["mfu"] * ref_med / med  # same FLOPs and same peak: scales with 1/time
    if prec == "fp16-pure":
        loss_scale = manual_scale[0]
    elif scaler is not None:
        loss_scale = float(scaler.get_scale())
    else:
        loss_scale = 1.0
    row = {
        "status": "ok", "error": None, "memory": memory,
        "time": {"samples_s": samples, "median_s": med, "p10_s": quantile(samples, 0.1),
                 "p90_s": quantile(samples, 0.9), "cv": cv(samples)},
        "throughput": {"samples_per_s": samples_per_step / med,
                       "tokens_per_s": samples_per_step * tokens_per_sample / med,
                       "flops_per_step": flops,
                       "tflops": flops / med / 1e12 if flops else None, "mfu": mfu},
        "train": {"loss_first": losses[0], "loss_last": losses[-1],
                  "skipped_steps": skipped_steps, "loss_scale": loss_scale},
        # Input copies only; save_on_cpu's traffic is not observable from outside.
        "transfer": None if offload else {"h2d_bytes": input_bytes * steps,
                                          "d2h_bytes": 4 * steps},
    }
    if not all(math.isfinite(v) for v in (losses[0], losses[-1])):
        row["status"] = "error"
        row["error"] = f"non-finite loss ({losses[0]} -> {losses[-1]})"
    return row


def failed_row(status, message):
    return {"status": status, "error": message, "memory": None, "time": None,
            "throughput": None, "train": None, "transfer": None}


def child_main(spec_path, out_path):
    spec = json.loads(pathlib.Path(spec_path).read_text())
    import torch
    try:
        row = run_point(spec)
    except Exception as e:  # noqa: BLE001 - every failure is a result row
        msg = str(e).strip().splitlines()
        msg = msg[0] if msg else type(e).__name__
        row = failed_row("oom" if is_oom(torch, e) else "error", f"{type(e).__name__}: {msg}")
    pathlib.Path(out_path).write_text(json.dumps(row))


def probe_main():
    import platform

    import torch
    info = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
            "versions": {"torch": torch.__version__, "python": platform.python_version()}}
    if torch.version.cuda:
        info["versions"]["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
        info["capacity"] = torch.cuda.get_device_properties(0).total_memory
        cudnn = torch.backends.cudnn.version()
        if cudnn:
            info["versions"]["cudnn"] = str(cudnn)
    print(json.dumps(info))


# ---- parent -------------------------------------------------------------------------------

def run_isolated(spec, timeout, tmp, idx):
    spec_path = pathlib.Path(tmp) / f"spec-{idx}.json"
    out_path = pathlib.Path(tmp) / f"row-{idx}.json"
    spec_path.write_text(json.dumps(spec))
    try:
        res = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()),
                              "--_child", str(spec_path), "--_child-out", str(out_path)],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return failed_row("timeout", f"no result after {timeout:g}s")
    if out_path.exists():
        return json.loads(out_path.read_text())
    tail = (res.stderr.strip() or res.stdout.strip()).splitlines()
    return failed_row("error", f"child exited {res.returncode}: {tail[-1] if tail else ''}")


def write_results(path, doc):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def fmt_bytes(b):
    return "-" if b is None else f"{b / 2**20:.2f} MiB"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--points", help="memtrade results file: run exactly its points")
    src.add_argument("--grid", help="grid TOML (ids from `memtrade run --grid FILE --list`)")
    ap.add_argument("--model")
    ap.add_argument("--batch-size", type=int)
    for axis in ("accumulation", "precision", "autocast-policy", "checkpoint", "optimizer",
                 "offload", "zero-grad", "mode", "empty-cache", "input"):
        ap.add_argument(f"--{axis}")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--memtrade", default="build/memtrade", help="memtrade binary")
    ap.add_argument("--out", help="results file to write")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--warmup", type=int, help="warm-up steps (default: grid's, else 2)")
    ap.add_argument("--steps", type=int,
                    help="measured steps (default: memtrade's sample count / grid's, else 8)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per point")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--in-process", action="store_true",
                    help="run every point in this process (faster; peaks may leak between points)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--_child-out", help=argparse.SUPPRESS)
    ap.add_argument("--_probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._probe:
        probe_main()
        return 0
    if args._child:
        child_main(args._child, args._child_out)
        return 0
    try:
        return run_all(args)
    except BadInput as e:
        print(f"torch_step: {e}", file=sys.stderr)
        return 2


def run_all(args):
    if not args.out:
        raise BadInput("--out is required")
    knob_flags = [("--accumulation", args.accumulation), ("--precision", args.precision),
                  ("--autocast-policy", args.autocast_policy),
                  ("--checkpoint", args.checkpoint), ("--optimizer", args.optimizer),
                  ("--offload", args.offload), ("--zero-grad", args.zero_grad),
                  ("--mode", args.mode), ("--empty-cache", args.empty_cache),
                  ("--input", args.input)]
    binary = args.memtrade
    src_meta = {"grid": "point", "grid_hash": None, "capacity": None}
    settings = {}
    if args.points:
        if args.model or args.batch_size:
            raise BadInput("--points and the knob flags (--model, ...) exclude each other")
        points, src_meta = points_from_results(args.points)
    elif args.grid:
        settings = grid_settings(args.grid)
        points = points_from_list(binary, ["--grid", args.grid, "--backend", args.device],
                                  int(settings.get("seed") or 0))
        src_meta["grid"] = settings.get("name") or pathlib.Path(args.grid).stem
    elif args.model:
        flags = ["--model", args.model]
        if args.batch_size is not None:
            flags += ["--batch-size", str(args.batch_size)]
        flags += [x for f, v in knob_flags if v is not None for x in (f, v)]
        if args.seed is not None:
            flags += ["--seed", str(args.seed)]
        points = points_from_list(binary, flags, args.seed or 0)
    else:
        raise BadInput("give --points FILE, --grid FILE or --model M [knob flags]")
    if not points:
        raise BadInput("no points to run")

    res = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--_probe"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        tail = res.stderr.strip().splitlines()
        raise BadInput(f"cannot import torch: {tail[-1] if tail else res.returncode}")
    probe = json.loads(res.stdout.strip().splitlines()[-1])
    if args.device == "cuda" and not probe["cuda_available"]:
        raise BadInput("--device cuda but torch.cuda.is_available() is False")
    device_name = probe.get("device") if args.device == "cuda" else \
        f"cpu ({os.cpu_count()} cores, torch {probe['torch']})"

    doc = {"schema": "memtrade.results/1",
           "meta": {"commit": None, "dirty": None,
                    "time": datetime.datetime.now(datetime.timezone.utc)
                    .strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "host": socket.gethostname(), "backend": args.device, "device": device_name,
                    "capacity": probe.get("capacity") if args.device == "cuda" else None,
                    "grid": src_meta.get("grid"), "grid_hash": src_meta.get("grid_hash"),
                    "memtrade": None, "peer": "pytorch-eager", "versions": probe["versions"],
                    "peak_tflops": None},
           "points": []}
    warmup = args.warmup if args.warmup is not None else int(settings.get("warmup") or 2)
    failures = 0
    hyper_cache = {}
    with tempfile.TemporaryDirectory(prefix="torch_step-") as tmp:
        for n, p in enumerate(points):
            cfg = dict(p["config"])
            ref = p["ref"]
            steps = args.steps
            if steps is None and ref and (ref.get("time") or {}).get("samples_s"):
                steps = len(ref["time"]["samples_s"])
            if steps is None:
                steps = int(settings.get("steps") or 8)
            reason = skip_reason(cfg, args.device)
            if reason:
                row = failed_row("skipped", reason)
            else:
                if not isinstance(cfg.get("hyper"), dict):
                    cfg["hyper"] = hyper_for(binary, cfg["model"], hyper_cache, tmp)
                spec = {"config": cfg, "hyper": cfg["hyper"], "device": args.device,
                        "warmup": warmup, "steps": max(1, steps), "threads": args.threads,
                        "ref": ref}
                if args.in_process:
                    import torch
                    try:
                        row = run_point(spec)
                    except Exception as e:  # noqa: BLE001
                        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
                        row = failed_row("oom" if is_oom(torch, e) else "error",
                                         f"{type(e).__name__}: {msg}")
                    if args.device == "cuda":
                        import gc
                        gc.collect()
                        torch.cuda.empty_cache()
                else:
                    row = run_isolated(spec, args.timeout, tmp, n)
            failures += row["status"] in ("error", "timeout")
            doc["points"].append({"id": p["id"], "config": cfg, **row})
            write_results(args.out, doc)  # as points finish: nothing lost to a crash
            med = (row.get("time") or {}).get("median_s")
            peak = (row.get("memory") or {}).get("peak_allocated")
            print(f"[{n + 1}/{len(points)}] {row['status']:<8} "
                  f"{fmt_bytes(peak):>12} {'-' if med is None else f'{med * 1e3:.2f} ms':>10}  "
                  f"{p['id']}" + (f"  ({row['error']})" if row["error"] else ""),
                  file=sys.stderr, flush=True)
    print(f"{len(points)} points ({args.device}, pytorch-eager), results: {args.out}",
          file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
