"""Per-layer, per-rank activations under tensor (and sequence) parallelism against Korthikanti et
al. (2022), Table 2 (ci/korthikanti.py): what memtrade keeps per tensor sums to the memory
model's measurement (one layer more, minus one layer less, at the peak, rank 0), and the gap to
the dropout-free formula is exactly the norms' fp32 statistics for GPT, plus grouped-query K/V,
SwiGLU and HF's fp32 softmax output for Llama."""
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))
import korthikanti as K  # noqa: E402

# Batch 16: the CI sizes' activations must outweigh their model states, so that the peak comes
# while every layer's activations are held (ci/korthikanti.py per_layer).
B = 16
CASES = [("gpt-mini", "", 64, t, sp) for t in (2, 4) for sp in (False, True)] + [
    ("llama-mini", "", 64, 2, sp) for sp in (False, True)] + [
    ("llama-tiny", "", 32, 2, True), ("gpt-mini", "", 64, 1, False)]


@pytest.mark.parametrize("base,overrides,seq,tp,sp", CASES)
def test_tensors_sum_to_the_estimate_and_the_gap_is_named(memtrade_bin, base, overrides, seq,
                                                          tp, sp):
    measured, hyper = K.per_layer(memtrade_bin, base, overrides, seq, tp, sp, B)
    mine = K.tensors(hyper, seq, B, tp, sp)
    assert sum(mine.values()) == measured, (mine, measured)
    f = K.formulas(seq, B, hyper["n_embd"], hyper["n_head"], tp)
    plain = f["plain_sp"] if sp else f["plain"]
    stats = sum(v for k, v in mine.items() if k.endswith("stats"))
    theirs = K.formula_tensors(hyper, seq, B, tp, sp)
    assert sum(theirs.values()) == pytest.approx(plain)
    if hyper["family"] == "gpt":  # the same layer: only the norms' statistics differ
        assert measured - stats == pytest.approx(plain)
    else:
        qkv_gap = mine["attn.qkv"] - theirs["attn.qkv"]
        mlp_gap = (mine["mlp.gate"] + mine["mlp.up"] + mine["mlp.h (down input)"]
                   - theirs["MLP 4h input + output"])
        fp32_softmax = mine["attn.att fp32 (HF softmax output)"]
        assert measured - stats - qkv_gap - mlp_gap - fp32_softmax == pytest.approx(plain)


def test_sequence_parallel_divides_every_tensor_by_t(memtrade_bin):
    """With SP each rank keeps sbh/t of everything (the formula's point): t = 4 keeps a quarter
    of t = 1's per-layer activations, norm statistics included."""
    one, _ = K.per_layer(memtrade_bin, "gpt-mini", "", 64, 1, False, B)
    four, _ = K.per_layer(memtrade_bin, "gpt-mini", "", 64, 4, True, B)
    assert four * 4 == one
