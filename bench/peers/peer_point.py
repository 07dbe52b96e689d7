"""One memtrade point in PyTorch eager: the training loop of the peer (bench/peers/torch_step.py).

The point comes as memtrade resolved it (`run --list --json`): its config with every axis and the
model's hyper-parameters, and `resolved` (learning rate and optimizer hyper-parameters,
checkpoint plan, loss-scale settings). Nothing here chooses a value memtrade chooses. How each
knob maps onto PyTorch eager is in torch_step.py's docstring.
"""
import contextlib
import math
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cpu_isa  # noqa: E402
import memtrade_side  # noqa: E402


def skip_reason(cfg, device):
    """Knob settings PyTorch eager has no counterpart for (the point becomes a 'skipped' row)."""
    off, prec = cfg["offload"], cfg["precision"]
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
    if cfg.get("optimizer_impl") == "fused" and device != "cuda":
        return "optimizer_impl=fused: torch.optim's fused kernels are CUDA's in torch 1.13"
    policy = cfg["autocast_policy"]
    if prec in ("fp16", "bf16") and policy != f"torch-{device}":
        return (f"autocast_policy={policy}: torch.autocast on {device} follows PyTorch's "
                f"{device} lists (memtrade's torch-{device} policy)")
    if device != "cuda" and prec == "fp16-pure":
        return "precision=fp16-pure: PyTorch's CPU kernels lack fp16 (LayerNorm, addmm)"
    return None


def init_like_memtrade(torch, model, family, hyper):
    """GPT: nanoGPT's init (N(0, 0.02), residual projections 0.02/sqrt(2L), zero biases), as
    memtrade's models/families/gpt.cpp. Llama: HF's (N(0, 0.02) for every matrix, RMSNorm weights 1), as
    models/families/llama.cpp. MLP/CNN keep PyTorch's defaults, which memtrade mirrors."""
    if family == "llama":
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.02) if p.dim() == 2 else p.fill_(1.0)
        return
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


def grad_scaler(torch, resolved):
    """torch's GradScaler with memtrade's loss-scale settings (growth x2, back-off x0.5: both
    GradScaler's defaults and memtrade's LossScaler)."""
    kw = dict(init_scale=float(resolved["loss_scale_init"]), growth_factor=2.0,
              backoff_factor=0.5, growth_interval=int(resolved["loss_scale_growth_interval"]))
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
    import torch

    import numpy as np
    import torch_models

    cfg, resolved = spec["config"], spec["resolved"]
    hyper = cfg["hyper"]
    warmup, steps = spec["warmup"], spec["steps"]
    dev = torch.device(spec["device"])
    cuda = dev.type == "cuda"
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    family = torch_models.family_of(cfg)
    B, k = int(cfg["batch_size"]), int(cfg["accumulation"])
    prec = cfg["precision"]
    train = cfg["mode"] == "train"
    pinned = cfg["input"] == "pinned" and cuda
    seed = int(cfg["seed"])

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
    plan = memtrade_side.checkpoint_plan(resolved, n_blocks)

    def forward(x, t):
        return torch_models.plan_forward(model, [tuple(s) for s in plan["segments"]], x, t,
                                         selective=plan["selective"])

    # Data: seeded random micro-batches on the host, fresh ones every step (as memtrade's data
    # stream: a model that saw the same batch twice would drift from memtrade's loss), made and
    # copied to the device inside every timed step, as memtrade's step makes and stages its own
    # (Trainer::stage): both engines' step times include making their batch.
    g = torch.Generator().manual_seed(seed)

    def micro_batch(g=g):
        if family in ("gpt", "llama"):
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

    def step_batches():
        return [micro_batch() for _ in range(k)]

    input_bytes = sum(x.numel() * x.element_size() + t.numel() * t.element_size()  # one step's
                      for x, t in (micro_batch(torch.Generator()) for _ in range(k)))
    tokens_per_sample = int(hyper.get("seq_len", hyper.get("block_size", 1))) \
        if family in ("gpt", "llama") else 1

    params = [p for p in model.parameters() if p.requires_grad]
    # memtrade's optimizer_impl (absent in results before it: torch's own default).
    opt = torch_models.make_optimizer(resolved["optimizer_hyper"], params,
                                      cfg.get("optimizer_impl")) if train else None
    scaler = grad_scaler(torch, resolved) if (train and prec == "fp16" and cuda) else None
    # fp16-pure: [scale, clean steps since the last change], memtrade's loss-scale settings.
    manual_scale = [float(resolved["loss_scale_init"]), 0]
    growth_interval = int(resolved["loss_scale_growth_interval"])
    use_manual = train and prec == "fp16-pure"
    set_to_none = cfg["zero_grad"] == "set_to_none"
    offload = train and cfg["offload"] == "activations"
    per_step_empty = cuda and cfg["empty_cache"] == "per_step"

    def context():
        stack = contextlib.ExitStack()
        if not train:
            stack.enter_context(torch.no_grad())
        if amp_dtype is not None:
            stack.enter_context(torch.autocast(device_type=dev.type, dtype=amp_dtype))
        if offload:
            stack.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=cuda))
        return stack

    # 16-bit work on the CPU runs on the kernels of the CPU PyTorch believes it has.
    lowp_cpu = not cuda and (amp_dtype is not None or param_dtype != torch.float32)

    def step(host):
        """One optimizer step over `host`'s micro-batches; returns (mean loss, skipped)."""
        with cpu_isa.torch_lowp() if lowp_cpu else contextlib.nullcontext():
            return _step(host)

    def _step(host):
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
                    if manual_scale[1] >= growth_interval:
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
    cpu_samples = []  # CPU: the process's CPU time per step, every thread (compare_cpu.py --cpu)
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
            loss, skipped = step(step_batches())
            ev[1].record()
            ev[1].synchronize()
            dt = ev[0].elapsed_time(ev[1]) / 1e3
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            loss, skipped = step(step_batches())
            dt = time.perf_counter() - t0
            cpu_samples.append(time.process_time() - c0)
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

    med = float(np.median(samples))
    memory = {"peak_allocated": None, "peak_requested": None, "peak_reserved": None,
              "breakdown_at_peak": None, "predicted_peak": None, "device_peak": device_peak,
              "host_pinned_peak": (input_bytes if pinned else 0) if not offload else None}
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
        # numpy's default quantile is the linear interpolation memtrade reports too.
        "time": {"samples_s": samples, "median_s": med,
                 "p10_s": float(np.quantile(samples, 0.1)),
                 "p90_s": float(np.quantile(samples, 0.9)),
                 "cv": float(np.std(samples, ddof=1) / np.mean(samples)) if len(samples) > 1
                 else 0.0,
                 **({"cpu_samples_s": cpu_samples[warmup:]} if not cuda else {})},
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


