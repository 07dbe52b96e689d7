"""memtrade keeps for backward what PyTorch keeps, for every checkpoint plan, in fp32 and under
bf16 autocast (memtrade's torch-cpu policy against PyTorch's CPU autocast).

Each point: `memtrade step --dump` (config, hyper-parameters, batch, checkpoint plan) and
`memtrade run --trace` (memtrade's `activations` bytes live when the step's last forward ends);
PyTorch's twin runs the same batch under the same plan (non-reentrant torch checkpoint on
memtrade's recomputed segments), and bench/peers/torch_saved counts what it keeps (method (a):
saved-tensor hooks plus checkpoint inputs). See bench/peers/saved_bytes.py.
"""
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"))
import memtrade_side  # noqa: E402
import saved_bytes  # noqa: E402
import torch_saved  # noqa: E402

BATCH = 4
TOLERANCE = 0.01  # memtrade's activations within 1% of PyTorch's kept bytes
# fp32, and bf16 autocast with PyTorch's CPU op lists (the policy PyTorch runs here).
PRECISIONS = {"fp32": ("fp32", "torch-cuda"), "bf16-torch-cpu": ("bf16", "torch-cpu")}
ROWS = []  # every compared point, printed as one table at the end of the module


def point(memtrade_bin, tmp_path, model, checkpoint, precision="fp32", policy="torch-cuda"):
    flags = memtrade_side.knob_flags(model, BATCH, checkpoint, precision, autocast_policy=policy)
    dump = memtrade_side.make_dump(memtrade_bin, tmp_path / "dump", flags)
    trace = memtrade_side.make_trace(memtrade_bin, tmp_path, flags)
    return saved_bytes.make_point(dump, trace)


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if ROWS:
        worst = max(ROWS, key=lambda r: abs(r["gap_rel"]))
        print("\n")
        saved_bytes.print_table(ROWS)
        print(f"worst: {worst['point']} {100 * worst['gap_rel']:+.2f}%")


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("checkpoint", ["0", "1", "0.5", "sqrt", "selective"])
@pytest.mark.parametrize("model", ["gpt-tiny", "mlp-tiny", "cnn-tiny"])
def test_memtrade_keeps_what_pytorch_keeps(memtrade_bin, tmp_path, model, checkpoint, precision):
    """Activations within 1%; under autocast also the weight casts kept for backward, exactly
    (memtrade's `casts` category against the bf16 copies of parameters autograd saved)."""
    torch.set_num_threads(1)
    p = point(memtrade_bin, tmp_path, model, checkpoint, *PRECISIONS[precision])
    row, _ = saved_bytes.measure_point(p, saved_bytes.autocast_for(p, "auto"), mallinfo=False)
    ROWS.append(row)
    assert abs(row["gap"]) <= TOLERANCE * row["torch_a"], (
        f"{p.label}: memtrade keeps {row['memtrade']:,} B of activations at the end of forward, "
        f"PyTorch {row['torch_a']:,} B (hooks {row['torch_hook_only']:,} + checkpoint inputs "
        f"{row['checkpoint_inputs']:,}); gap {100 * row['gap_rel']:+.2f}%")
    assert row["memtrade_casts"] == row["weight_casts"], (
        f"{p.label}: memtrade holds {row['memtrade_casts']:,} B of weight casts at the end of "
        f"forward, PyTorch's autograd {row['weight_casts']:,} B")


def test_hook_count_plus_checkpoint_inputs_is_what_the_allocator_holds(memtrade_bin, tmp_path):
    """Method (a) against an independent count: the c10 allocator's net bytes over the forward
    (profiler) equal (a) plus one RNG state per checkpoint, to the byte. A hook-only count falls
    short by exactly the checkpoint inputs."""
    torch.set_num_threads(1)
    p = point(memtrade_bin, tmp_path, "gpt-tiny", "sqrt")
    model = torch_saved.build_twin(p.hyper)
    plan = p.plan(p.hyper["n_layer"])
    x, t = torch_saved.make_batch("gpt", p.hyper, BATCH, p.dump)
    kept, _ = torch_saved.measure(model, plan, x, t, mallinfo=False, profiler=True)
    assert kept.checkpoints == 1 and kept.checkpoint_inputs > 0
    assert kept.comparable(kept.profiler) == kept.hooks + torch_saved.checkpoint_rng_state_bytes()
    assert kept.hooks - kept.hooks_only == kept.checkpoint_inputs


def test_plan_comes_from_memtrade(memtrade_bin):
    """The checkpoint plan is memtrade's (meta.json or run --list --json), never re-derived; one
    that does not cover the blocks in order, or none at all, is bad input."""
    plan = {"selective": False, "segments": [[0, 2, True], [2, 3, False]]}
    assert memtrade_side.checkpoint_plan({"checkpoint_plan": plan}, 3) == plan
    listed = memtrade_side.list_points(memtrade_bin, ["--model", "gpt-mini", "--checkpoint",
                                                      "sqrt", "--backend", "cpu"])
    assert memtrade_side.checkpoint_plan(listed["points"][0]["resolved"], 4) == {
        "selective": False, "segments": [[0, 2, True], [2, 4, True]]}
    bad = {"selective": False, "segments": [[0, 1, True], [2, 3, False]]}
    for resolved in ({"checkpoint_plan": bad}, {}):
        with pytest.raises(memtrade_side.BadInput):
            memtrade_side.checkpoint_plan(resolved, 3)


def test_llama_differs_from_eager_pytorch_by_the_fused_kernels_only(memtrade_bin, tmp_path):
    """memtrade's Llama keeps what fused kernels keep (docs/pytorch.md); the HF-style eager twin
    keeps more, and the per-layer formula of that difference (RMSNorm's x² and normalised x,
    repeat_kv's expanded K/V, SwiGLU's silu(gate)) accounts for the whole gap within 1%."""
    torch.set_num_threads(1)
    p = point(memtrade_bin, tmp_path, "llama-tiny", "0")
    row, _ = saved_bytes.measure_point(p, "none", mallinfo=False)
    ROWS.append(row)
    assert row["eager_extra"] > 0.2 * row["torch_a"]  # the difference is real and large
    assert abs(row["gap"] + row["eager_extra"]) <= TOLERANCE * row["torch_a"], row
