"""Data parallelism is measured by running it: 2 real ranks (Open MPI processes) against 1.

Equivalence. `memtrade step --dp 2 --batch-size 4` trains on the samples of `--batch-size 8`
(rank r on its contiguous half). Its dump (rank 0 gathers the whole model) must equal dp 1's:
the gradients after the reduction and the weights after the step, to 1e-5 relative, for every
sharding stage, with accumulation, checkpointing and 16-bit precision.

Which dp-1 run is the reference, by the arithmetic:
  - fp32: dp 1 × b8. Each rank's GEMMs sum 4 rows where dp 1's sum 8; the fp32 sums differ by
    rounding only (about 1e-7 relative), far inside 1e-5.
  - bf16 autocast and bf16-o2: dp 1 × b4 × a2. A bf16 GEMM rounds its output to 8 bits, so a sum
    over 8 rows and two sums over 4 rows differ by up to 2^-8 relative: not the same math at
    1e-5. dp 2 × b4 and b4 × a2 compute the same 4-row products, and add the two halves once
    in fp32 (the all-reduce of 2 ranks, or accumulation): bit for bit the same additions.
  - bf16-o2 (and fp16-o2, whose bound is 2^-10 by the same rule) keeps 16-bit grads: dp 2 rounds the sum of the two halves to bf16 once (the
    all-reduce's fp32 add), b4 × a2 rounds as its backward accumulates into the bf16 grad. Each
    is within a rounding or two of bf16 (2^-8) of the other, so the grads' bound is 2^-7 of the
    largest gradient: 1e-5 is not a bf16 number's precision. The fp32 master after the step
    moves by lr × the gradient and keeps 1e-5.
  - cnn (batch norm): DDP without SyncBatchNorm normalises over each rank's own batch, so its
    reference is dp 1 × b4 × a2 too (the same per-micro-batch statistics).

Weights after the step: with sgd-momentum (the matrix below: stateful, so zero1-3 shard its
buffers, and linear in the gradient on the first step) the new weights inherit the gradients'
1e-5. Adam's first update, lr·g/(|g| + eps), is not linear: a gradient that fp32 rounding leaves
near zero (a bias whose true gradient is ~0) may flip its update's sign at any batch split. Its
test bounds each weight by the arithmetic instead: |Δp| <= 1e-5·max|p| + lr·|Δg|/(|g| + eps), the
update's derivative times the measured gradient difference.

Memory. A point with dp 2 runs through `memtrade run` (ranks under mpirun, one row with every
rank's memory): each rank's measured peak equals the memory model's prediction for that rank,
byte for byte, for every stage.
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None,
                                reason="Open MPI's mpirun is not installed (ci/setup.sh)")

SHARDINGS = ["none", "zero1", "zero2", "zero3", "torch-zero1"]
RTOL = 1e-5


def dump(memtrade_bin, out, *flags):
    cmd = [memtrade_bin, "step", "--backend", "cpu", *flags, "--dump", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}"
    return json.loads((out / "meta.json").read_text())


def assert_same(out, ref, meta, subs=("grads", "params_after")):
    worst = ("", 0.0)
    # 16-bit grads: two roundings of the dtype (unit roundoff bf16 2^-8, fp16 2^-11), see above.
    grad_rtol = {"bf16-o2": 2.0**-7, "bf16-pure": 2.0**-7, "fp16-o2": 2.0**-10,
                 "fp16-pure": 2.0**-10}.get(meta["config"]["precision"], RTOL)
    for sub in subs:
        rtol = grad_rtol if sub == "grads" else RTOL
        for name in meta["params"]:
            got = np.load(out / sub / f"{name}.npy").astype(np.float64)
            want = np.load(ref / sub / f"{name}.npy").astype(np.float64)
            scale = max(np.abs(want).max(), 1e-30)
            diff = np.abs(got - want)
            if sub == "params_after" and "grads" in subs:
                # sgd-momentum's first step moves each weight by lr·g: the grads' difference
                # (16-bit grads: up to 2^-7) moves the weights by lr times as much.
                dg = np.abs(np.load(out / "grads" / f"{name}.npy").astype(np.float64)
                            - np.load(ref / "grads" / f"{name}.npy"))
                diff = np.maximum(diff - meta["lr"] * dg * (1 + 1e-6), 0)
            err = diff.max() / scale
            if err > worst[1]:
                worst = (f"{sub}/{name}", err)
            assert err <= rtol, f"{sub}/{name}: {err:.3g} relative (bound {rtol})"
    return worst


CASES = [
    # (model, flags common to both, dp-1 reference's own flags)
    ("gpt-tiny", [], ["--batch-size", "8"]),
    ("llama-tiny", [], ["--batch-size", "8"]),            # GQA (n_kv_head < n_head)
    ("gpt-tiny", ["--checkpoint", "1"], ["--batch-size", "8"]),
    ("llama-tiny", ["--checkpoint", "selective"], ["--batch-size", "8"]),
    ("llama-tiny", ["--attention", "flash", "--seq-len", "16"], ["--batch-size", "8"]),
    ("gpt-tiny", ["--precision", "bf16"], ["--batch-size", "4", "--accumulation", "2"]),
    ("llama-tiny", ["--precision", "bf16-o2"], ["--batch-size", "4", "--accumulation", "2"]),
    # fp16 with loss scaling: the overflow check is all-reduced, every rank skips or none does.
    ("gpt-tiny", ["--precision", "fp16-o2"], ["--batch-size", "4", "--accumulation", "2"]),
    # ZeRO-Offload of each rank's part: the update on the host copy, the weights back.
    ("gpt-tiny", ["--offload", "optimizer"], ["--batch-size", "8"]),
    ("llama-tiny", ["--precision", "bf16-o2", "--offload", "optimizer"],
     ["--batch-size", "4", "--accumulation", "2"]),
    ("mlp-tiny", [], ["--batch-size", "8"]),
    ("cnn-tiny", [], ["--batch-size", "4", "--accumulation", "2"]),
]


@pytest.mark.parametrize("sharding", SHARDINGS)
@pytest.mark.parametrize("model,common,ref_flags", CASES,
                         ids=[f"{m}{''.join(c)}" for m, c, _ in CASES])
def test_dp2_equals_dp1(memtrade_bin, tmp_path, sharding, model, common, ref_flags):
    common = [*common, "--optimizer", "sgd-momentum"]
    if sharding == "torch-zero1" and "--offload" in common:
        # Not a PyTorch combination (ZeroRedundancyOptimizer updates on the device): exit 2.
        r = subprocess.run([memtrade_bin, "step", "--model", model, *common, "--dp", "2",
                            "--sharding", sharding], capture_output=True, text=True)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        return
    ref = tmp_path / "dp1"
    meta = dump(memtrade_bin, ref, "--model", model, *common, *ref_flags)
    out = tmp_path / "dp2"
    got = dump(memtrade_bin, out, "--model", model, *common, "--batch-size", "4",
               "--dp", "2", "--sharding", sharding)
    assert got["samples"] == meta["samples"] == 8
    assert np.array_equal(np.load(out / "inputs.npy"), np.load(ref / "inputs.npy"))
    assert abs(got["loss"] - meta["loss"]) <= RTOL * abs(meta["loss"])
    assert_same(out, ref, meta)


@pytest.mark.parametrize("sharding", SHARDINGS)
def test_dp2_with_accumulation(memtrade_bin, tmp_path, sharding):
    """no_sync: the grads of the first micro-batch stay local and are reduced with the last."""
    ref = tmp_path / "ref"
    meta = dump(memtrade_bin, ref, "--model", "gpt-tiny", "--batch-size", "2",
                "--accumulation", "4", "--optimizer", "sgd-momentum")
    out = tmp_path / "dp2"
    dump(memtrade_bin, out, "--model", "gpt-tiny", "--batch-size", "2", "--accumulation", "2",
         "--dp", "2", "--sharding", sharding, "--optimizer", "sgd-momentum")
    assert_same(out, ref, meta)


@pytest.mark.parametrize("sharding", SHARDINGS)
@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_dp2_adam_equals_dp1(memtrade_bin, tmp_path, sharding, model):
    ref = tmp_path / "dp1"
    meta = dump(memtrade_bin, ref, "--model", model, "--batch-size", "8", "--optimizer", "adam")
    out = tmp_path / "dp2"
    dump(memtrade_bin, out, "--model", model, "--batch-size", "4", "--dp", "2",
         "--sharding", sharding, "--optimizer", "adam")
    assert_same(out, ref, meta, subs=("grads",))
    lr, eps = meta["lr"], meta["optimizer_hyper"]["eps"]
    for name in meta["params"]:
        g_ref = np.load(ref / "grads" / f"{name}.npy").astype(np.float64)
        dg = np.abs(np.load(out / "grads" / f"{name}.npy") - g_ref)
        p_ref = np.load(ref / "params_after" / f"{name}.npy").astype(np.float64)
        dp = np.abs(np.load(out / "params_after" / f"{name}.npy") - p_ref)
        bound = RTOL * np.abs(p_ref).max() + lr * dg / (np.abs(g_ref) + eps)
        assert (dp <= bound * (1 + 1e-6)).all(), f"{name}: {(dp - bound).max():.3g} over the bound"


def test_per_rank_memory_is_predicted_exactly(memtrade_bin, tmp_path):
    base = ('[run]\nwarmup = 1\nsteps = 1\n[axes]\nmodel = ["gpt-tiny", "llama-tiny"]\n'
            'batch_size = [4]\ndata_parallel = [2]\nprecision = ["fp32", "bf16-o2"]\n')
    grids = {  # every stage; ZeRO-Offload with the stages that take it
        "stages": base + f"sharding = {json.dumps(SHARDINGS)}\n",
        "offload": base + 'sharding = ["none", "zero1", "zero2", "zero3"]\noffload = ["optimizer"]\n',
    }
    points = []
    for name, text in grids.items():
        grid = tmp_path / f"{name}.toml"
        grid.write_text(text)
        out = tmp_path / f"{name}.json"
        r = subprocess.run([memtrade_bin, "run", "--grid", str(grid), "--backend", "cpu",
                            "--out", str(out), "--quiet"], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        points += json.loads(out.read_text())["points"]
    assert len(points) == 4 * len(SHARDINGS) + 16
    peaks = {}
    for p in points:
        assert p["status"] == "ok", p
        ranks = p["memory"]["per_rank"]
        assert [x["rank"] for x in ranks] == [0, 1]
        for x in ranks:
            assert x["peak_allocated"] == x["predicted_peak"], (p["id"], x)
        assert p["memory"]["peak_allocated"] == max(x["peak_allocated"] for x in ranks)
        if p["config"]["offload"] == "none":
            peaks[(p["config"]["model"], p["config"]["precision"], p["config"]["sharding"])] = \
                p["memory"]["peak_allocated"]
    # Each stage holds less than the one before it (these models are all model states).
    for model in ("gpt-tiny", "llama-tiny"):
        for prec in ("fp32", "bf16-o2"):
            stages = [peaks[(model, prec, s)] for s in ("none", "zero1", "zero2")]
            assert stages[2] <= stages[1] < stages[0], (model, prec, stages)


def resident(memtrade_bin, rank, *flags):
    out = subprocess.run([memtrade_bin, "estimate", "--backend", "cpu", "--json", "--rank",
                          str(rank), "--zero-grad", "zero", "--batch-size", "4", *flags],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["points"][0]["resident_after_step"]


@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny", "mlp-tiny", "cnn-tiny"])
def test_ddp_bytes_match_pytorch_ddp(memtrade_bin, model):
    """Each rank's parameters, gradients with DDP's buckets, and Adam state, against torch 1.13's
    DistributedDataParallel on 2 gloo ranks (tests/python/ddp_reference.py), as PyTorch's CUDA
    caching allocator rounds them (512 B per tensor, Adam's CPU 'step' tensors left out); 1%."""
    import ddp_reference
    torch_ranks = ddp_reference.measure(model, "adam", "ddp")
    for t in torch_ranks:
        m = resident(memtrade_bin, t["rank"], "--model", model, "--dp", "2")
        want = {"params": t["params_512"] + t["buffers_512"],
                "grads": t["grads_512"] + t["bucket_bytes_512"],
                "optimizer": t["optimizer_state_512"]}
        for cat, w in want.items():
            assert abs(m[cat] - w) <= 0.01 * w, (model, t["rank"], cat, m[cat], w)


@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_torch_zero1_bytes_match_pytorch_zero_redundancy_optimizer(memtrade_bin, model):
    """--sharding torch-zero1 against torch 1.13's ZeroRedundancyOptimizer over DDP on 2 gloo
    ranks: the same whole parameters per rank, so each rank's parameters, grads with DDP's
    buckets and Adam state; 1%. (On gpt-small the state is made into blocks that backward freed
    and some large ones stay whole: the allocator's figures exceed the tensors' bytes by up to
    3.5%, which a CPU run of PyTorch, with no caching allocator to read, cannot show.)"""
    import ddp_reference
    for t in ddp_reference.measure(model, "adam", "zero"):
        m = resident(memtrade_bin, t["rank"], "--model", model, "--dp", "2", "--sharding",
                     "torch-zero1")
        want = {"params": t["params_512"] + t["buffers_512"],
                "grads": t["grads_512"] + t["bucket_bytes_512"],
                "optimizer": t["optimizer_state_512"]}
        for cat, w in want.items():
            assert abs(m[cat] - w) <= 0.01 * w, (model, t["rank"], cat, m[cat], w)


def test_a_rank_killed_mid_run_is_an_error_row_and_the_grid_goes_on(memtrade_bin, tmp_path):
    grid = tmp_path / "kill.toml"
    grid.write_text('[run]\nwarmup = 2\nsteps = 8\n[axes]\nmodel = ["gpt-small", "gpt-tiny"]\n'
                    'batch_size = [2]\ndata_parallel = [2]\n')
    out = tmp_path / "kill.json"
    env = dict(os.environ, MEMTRADE_FAULT="kill_rank:gpt-small")  # rank 1 SIGKILLs itself
    r = subprocess.run([memtrade_bin, "run", "--grid", str(grid), "--backend", "cpu", "--out",
                        str(out), "--quiet"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 1, r.stdout + r.stderr  # a point failed; the file is whole
    killed, fine = json.loads(out.read_text())["points"]
    assert killed["status"] == "error" and "rank 1" in killed["error"], killed
    assert "signal 9" in killed["error"], killed["error"]
    assert fine["status"] == "ok" and len(fine["memory"]["per_rank"]) == 2


def test_a_failed_rank_writes_its_row(memtrade_bin, tmp_path):
    """An OOM on the ranks: the row says oom, names the rank, and the job ends (MPI_Abort)
    instead of leaving the other rank waiting until the timeout."""
    grid = tmp_path / "oom.toml"
    grid.write_text('[run]\nwarmup = 1\nsteps = 1\ncapacity = "1MiB"\ntimeout = "120s"\n'
                    '[axes]\nmodel = ["gpt-tiny"]\nbatch_size = [4]\ndata_parallel = [2]\n')
    out = tmp_path / "oom.json"
    r = subprocess.run([memtrade_bin, "run", "--grid", str(grid), "--backend", "cpu", "--out",
                        str(out), "--quiet"], capture_output=True, text=True, timeout=300)
    (p,) = json.loads(out.read_text())["points"]
    assert p["status"] == "oom" and p["error"].startswith("rank "), p
    assert p["wall_s"] < 60, p["wall_s"]


def test_tensor_parallel_points_run_as_ranks_and_each_rank_is_predicted(memtrade_bin, tmp_path):
    """tp 2 (SP off and on), tp 2 × dp 2 (DDP, zero2, zero3) through `memtrade run`: tp × dp ranks under
    mpirun, one row with every rank's memory, each rank's peak its prediction (the tp ranks hold
    slices of the weights; rank 0 the largest vocabulary part)."""
    grids = {
        "tp": '[axes]\nmodel = ["gpt-tiny", "llama-tiny"]\ntensor_parallel = [2]\n'
              'sequence_parallel = ["off", "on"]\ndata_parallel = [1, 2]\n',
        # ZeRO inside each tp slice: the dp group shards the slices, SP's grads reduced after
        "zero": '[axes]\nmodel = ["llama-tiny"]\ntensor_parallel = [2]\n'
                'sequence_parallel = ["on"]\ndata_parallel = [2]\nsharding = ["zero2", "zero3"]\n'
                'precision = ["bf16-o2"]\n',
    }
    points = []
    for name, axes in grids.items():
        grid = tmp_path / f"{name}.toml"
        grid.write_text('[run]\nwarmup = 1\nsteps = 1\n' + axes +
                        'batch_size = [2]\nseq_len = [16]\n')
        out = tmp_path / f"{name}.json"
        r = subprocess.run([memtrade_bin, "run", "--grid", str(grid), "--backend", "cpu", "--out",
                            str(out), "--quiet"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        points += json.loads(out.read_text())["points"]
    assert len(points) == 10
    for p in points:
        assert p["status"] == "ok", p
        world = p["config"]["tensor_parallel"] * p["config"]["data_parallel"]
        ranks = p["memory"]["per_rank"]
        assert [x["rank"] for x in ranks] == list(range(world))
        for x in ranks:
            assert x["peak_allocated"] == x["predicted_peak"], (p["id"], x)
