"""The memory atlas (ci/atlas.py -> docs/atlas.md): its reference columns are the published closed
forms, its memtrade columns are the estimates' own numbers, every off cell is explained, and bad
input is one line and exit 2."""
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from reports import atlas as R  # noqa: E402

MiB = 1 << 20


def test_closed_forms():
    # Korthikanti et al. §4.1, gpt2-124m at s = 1024, b = 1: sbh(34 + 5as/h) = 1024·768·114.
    assert R.korthikanti(1024, 1, 768, 12, True) == 1024 * 768 * 114
    # Without dropout: the masks (as²b + 2sbh) and the dropout output (2as²b) go.
    s, b, h, a = 2048, 2, 1024, 16
    assert R.korthikanti(s, b, h, a, True) - R.korthikanti(s, b, h, a, False) == \
        2 * s * b * h + 3 * a * s * s * b
    assert R.zero_model_states(124_439_808) == 16 * 124_439_808
    # Llama-3.2-1B's layer: K/V at 8 of 32 heads (−3 sbh), SwiGLU at I = 4h (+8 sbh).
    terms = dict((w.split(",")[0], d) for w, d in R.adapted_terms(
        {"n_embd": 2048, "n_head": 32, "n_kv_head": 8, "intermediate_size": 8192}))
    assert terms == {"grouped-query attention": -3.0, "SwiGLU": 8.0}
    assert R.adapted_terms({"n_embd": 768, "n_head": 12}) == []


def run_atlas(memtrade_bin, out, work, *args):
    return subprocess.run([sys.executable, str(ROOT / "ci" / "atlas.py"), memtrade_bin, str(out),
                           "--work", str(work), *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def page(memtrade_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("atlas")
    r = run_atlas(memtrade_bin, d / "docs", d / "work", "--models", "gpt2-124m,llama3.2-1b",
                  "--seq-lens", "1024,2048", "--cards", "24GiB,80GiB", "--gpu", "h100")
    assert r.returncode == 0, r.stderr
    return d


def table(text, caption_start):
    """The rows (lists of cells) of the markdown table after the caption starting so."""
    lines = text.splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith(caption_start))
    rows = []
    for l in lines[i + 2:]:
        if not l.startswith("|"):
            break
        rows.append([c.strip() for c in l.strip("|").split("|")])
    return rows[0], rows[2:]


def test_page_is_labelled_and_drawn(page):
    text = (page / "docs" / "atlas.md").read_text()
    assert text.startswith("# Memory atlas (predicted)")
    captions = [l for l in text.splitlines() if l.startswith("**Table")]
    assert len(captions) >= 4 and all("predicted by the CUDA memory model, not measured" in c
                                      for c in captions)
    for name in ("atlas-peak", "atlas-breakdown"):
        png = page / "docs" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
        assert f"]({name}.png)" in text
    assert "positions extended" in text  # gpt2-124m at 2048 runs with block_size = 2048


def test_reference_columns_are_the_formulas_and_memtrade_columns_the_estimates(page):
    text = (page / "docs" / "atlas.md").read_text()
    head, rows = table(text, "**Table 1.**")
    psi = {(r[0], r[1]): int(r[2].replace(",", "")) for r in rows}
    assert psi["gpt2-124m", "as published"] == 124_439_808
    assert psi["llama3.2-1b", "as published"] == 1_235_814_400
    for r in rows:
        assert int(r[3].replace(",", "")) == 16 * int(r[2].replace(",", ""))

    est = json.loads((page / "work" / "layers.json").read_text())
    hyper = {p["config"]["model"]: p["config"]["hyper"] for p in est["points"]}
    head, rows = table(text, "**Table 2.**")
    assert rows and head[3].startswith("Korthikanti")
    for r in rows:
        s = int(r[1].split()[0])
        h, a = (int(x) for x in r[2].split(","))
        assert float(r[3].replace(",", "")) == pytest.approx(R.korthikanti(s, 1, h, a, True) / MiB,
                                                             abs=0.05)
        assert float(r[4].replace(",", "")) == pytest.approx(R.korthikanti(s, 1, h, a, False) / MiB,
                                                             abs=0.05)
        # memtrade's column: one layer's activations, L layers minus L − 1, from the estimates
        # (a tied head untied: ci/atlas.py UNTIE_FOR_LAYERS; block_size extended past the model's).
        def value(over):
            return r[0] + (":" + ",".join(f"{k}={v}" for k, v in sorted(over.items())) if over else "")

        untie = {"tie_word_embeddings": "false"} if any(
            m.startswith(r[0] + ":") and "tie_word_embeddings=false" in m for m in hyper) else {}
        over = untie if value(untie) in hyper and s <= int(hyper[value(untie)]["block_size"]) \
            else {**untie, "block_size": s}
        base = value(over)
        n = int(hyper[base]["n_layer"])

        def act(model, precision="bf16", attention="math"):
            (p,) = [p for p in est["points"] if p["config"]["model"] == model
                    and p["config"]["precision"] == precision
                    and p["config"]["attention"] == attention
                    and (int(p["config"]["seq_len"]) or int(p["config"]["hyper"]["block_size"])) == s]
            return p["breakdown_at_peak"]["activations"]

        less = value({**over, "n_layer": n - 1})
        assert float(r[5].replace(",", "")) == pytest.approx((act(base) - act(less)) / MiB, abs=0.05)


def test_every_cell_further_than_ten_percent_is_explained(page):
    text = (page / "docs" / "atlas.md").read_text()
    head, rows = table(text, "**Table 2.**")
    reasons = [l for l in text.splitlines() if l.startswith("- ")]
    ratio_cols = [i for i, h in enumerate(head) if h.startswith("×")]
    n_off = 0
    for r in rows:
        for i in ratio_cols:
            x = float(r[i].lstrip("×"))
            if abs(x - 1) > R.TOLERANCE:
                n_off += 1
                s = r[1].split()[0]
                assert any(l.startswith(f"- {r[0]}, s = {s}, ") and f"×{x:.2f}" in l
                           for l in reasons), (r[0], s, head[i], x)
    assert n_off > 0
    # The per-model 16Ψ tables: every ratio off by more than 10% has its sentence.
    for model in ("gpt2-124m", "llama3.2-1b"):
        sec = text.split(f"### {model}", 1)[1].split("\n### ", 1)[0]
        head, rows = table(sec, "**Table")
        for r in rows:
            x = float(r[-1].lstrip("×"))
            if abs(x - 1) > R.TOLERANCE:
                assert re.search(rf"^- s = {r[0].split()[0]}, {re.escape(r[1])}: ×{x:.2f} — ", sec,
                                 re.M), (model, r[:2], x)


def test_fit_columns_are_memtrade_fit(page, memtrade_bin, tmp_path):
    text = (page / "docs" / "atlas.md").read_text()
    sec = text.split("### gpt2-124m", 1)[1].split("\n### ", 1)[0]
    caps = [l for l in sec.splitlines() if l.startswith("**Table") and "largest batch" in l]
    assert caps
    head, rows = table(sec, caps[0])
    (row,) = [r for r in rows if r[0] == "1024" and r[1] == "checkpoint 0 · flash"]
    out = tmp_path / "fit.json"
    subprocess.run([memtrade_bin, "fit", "--backend", "cuda", "--model", "gpt2-124m", "--precision",
                    "bf16", "--optimizer", "adamw", "--attention", "flash", "--capacity", "24GiB",
                    "--json", str(out)], check=True, capture_output=True)
    (fit,) = json.loads(out.read_text())["rows"]
    assert int(row[head.index("24GiB card")]) == fit["max_batch"] > 0


def test_tensor_parallel_table_is_the_estimates_per_rank(page, memtrade_bin):
    text = (page / "docs" / "atlas.md").read_text()
    cap = next(l for l in text.splitlines() if l.startswith("**Table") and "throughput" in l)
    head, rows = table(text, cap)
    got = {(r[0], r[1], r[2]): r for r in rows}
    # gpt2-124m's 12 heads split over 1, 2 and 4 GPUs, not 8; Llama 3.2 1B's 32 heads and 8 KV
    # heads over all four.
    assert {k[2] for k in got if k[:2] == ("gpt2-124m", "1024")} == {"1", "2", "4"}
    assert {k[2] for k in got if k[:2] == ("llama3.2-1b", "2048")} == {"1", "2", "4", "8"}
    gib = lambda cell: float(cell.split()[0])  # noqa: E731
    for m, s in [("gpt2-124m", "1024"), ("llama3.2-1b", "2048")]:
        peaks = [gib(got[m, s, t][head.index("peak, SP off")]) for t in ("1", "2", "4")]
        assert peaks == sorted(peaks, reverse=True)  # more ranks, less per rank
        on = gib(got[m, s, "2"][head.index("peak, SP on")])
        assert on <= peaks[1]  # SP splits what tp 2 leaves replicated (with every block
        # checkpointed little is left: gpt2-124m at 1024 tokens keeps 1.23 GiB either way)
    # The cells are `estimate`'s own: llama3.2-1b at 2048 tokens, tp 4, SP on.
    r = subprocess.run([memtrade_bin, "estimate", "--backend", "cuda", "--model", "llama3.2-1b",
                        "--seq-len", "2048", "--precision", "bf16", "--optimizer", "adamw",
                        "--checkpoint", "1", "--attention", "flash", "--tp", "4",
                        "--sequence-parallel", "on", "--batch-size", "1", "--gpu", "h100", "--json"],
                       check=True, capture_output=True, text=True)
    (p,) = json.loads(r.stdout)["points"]
    row = got["llama3.2-1b", "2048", "4"]
    assert row[head.index("peak, SP on")] == R.gib(p["peak_allocated"])
    t = p["time_model"]
    assert row[head.index("(SP on)")] == f"{R.rate(t['tokens_per_s_per_gpu'])}, {100 * t['mfu']:.1f}%"
    assert t["gpus"] == 4 and t["shares"]["comm"] > 0  # the tp collectives are priced


@pytest.mark.parametrize("args, words", [
    (["--models", "gpt2-nonesuch"], "gpt2-nonesuch"),
    (["--cards", "24GB"], "GiB"),
    (["--seq-lens", "1k"], "--seq-lens"),
    (["--models", "gpt2-124m", "--seq-lens", "1024", "--gpu", "h9000"], "h9000"),
])
def test_bad_input_is_one_line_and_exit_2(memtrade_bin, tmp_path, args, words):
    r = run_atlas(memtrade_bin, tmp_path / "docs", tmp_path / "work", *args)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr
    assert not (tmp_path / "docs" / "atlas.md").exists()


# ---------------------------------------------------------------------------------------------
# Models a Hugging Face config.json defines (--model-config): the published files shrunk to a few
# MiB so that the page takes seconds, each keeping what the page treats apart: a dense
# Llama-like decoder (Qwen2), one memtrade takes no flash attention or tensor parallelism for
# (Gemma 2) and a mixture of experts (Mixtral).

HF = ROOT / "tests" / "models" / "fixtures" / "hf"
TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "num_hidden_layers": 3, "vocab_size": 512, "max_position_embeddings": 4096}


def tiny_config(directory, published, name, **more):
    cfg = {**json.loads((HF / f"{published}.json").read_text()), **TINY, **more}
    path = directory / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def config_page(memtrade_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("atlas-configs")
    files = [tiny_config(d, "Qwen2.5-7B", "tiny-qwen2", sliding_window=4096),
             tiny_config(d, "gemma-2-9b", "tiny-gemma2", head_dim=16, query_pre_attn_scalar=16),
             tiny_config(d, "Mixtral-8x7B-v0.1", "tiny-mixtral", num_local_experts=4)]
    r = run_atlas(memtrade_bin, d / "docs", d / "work", "--models",
                  ",".join(["llama3.2-1b"] + [str(f) for f in files]), "--seq-lens", "1024,2048",
                  "--cards", "24GiB", "--gpu", "h100")
    assert r.returncode == 0, r.stderr
    return d, files


def test_the_model_list_has_one_home():
    assert R.MODELS == R.BUILTIN_MODELS + list(R.CONFIG_MODELS)
    for name in ("qwen2.5-7b", "mistral-7b", "gemma-2-9b", "mixtral-8x7b"):
        path = pathlib.Path(R.model_file(name))
        assert path.is_file() and R.model_args(name) == ["--model-config", str(path)]
    assert R.model_args("llama3-8b") == ["--model", "llama3-8b"] and R.model_file("llama3-8b") == ""
    assert R.display_name("/x/tiny-qwen2.json") == "tiny-qwen2" and R.is_config("/x/tiny-qwen2.json")
    # What a setting runs where memtrade refuses part of it.
    case = R.Case("g", 1024, "/x/g.json", False, (), refused={"attention": ("flash", "no")})
    flash = {"checkpoint": "1", "attention": "flash"}
    assert not R.runs(case, flash) and R.runs(case, {"checkpoint": "1", "attention": "math"})
    assert R.instead(case, flash) == {"checkpoint": "1", "attention": "math"}
    assert R.instead_mark(case, flash) == " (math)"


def test_config_models_are_the_estimates_of_their_files(config_page, memtrade_bin):
    d, (qwen, gemma, moe) = config_page
    text = (d / "docs" / "atlas.md").read_text()
    # The models table names each file; Table 1's Ψ is memtrade's count for the file.
    for f in (qwen, gemma, moe):
        assert f"| {f.stem} | `--model-config {f}` |" in text
    head, rows = table(text, "**Table 1.**")
    psi = {r[0]: int(r[2].replace(",", "")) for r in rows}
    r = subprocess.run([memtrade_bin, "estimate", "--backend", "cuda", "--model-config", str(qwen),
                        "--seq-len", "1024", "--batch-size", "1", "--json"],
                       check=True, capture_output=True, text=True)
    (p,) = json.loads(r.stdout)["points"]
    assert psi["tiny-qwen2"] == p["config"]["hyper"]["num_params"]
    # The per-layer comparison takes the dense file (its layer counts are copies of the file) and
    # leaves out, with the reason, the one without flash attention and the mixture of experts.
    head, rows = table(text, "**Table 2.**")
    assert {r[0] for r in rows} == {"llama3.2-1b", "tiny-qwen2"}
    est = json.loads((d / "work" / "layers.json").read_text())

    def act(n_layer):
        (p,) = [p for p in est["points"] if p["config"].get("model_config", "").endswith(
                    "tiny-qwen2.json" if n_layer == 3 else f"tiny-qwen2-n_layer{n_layer}.json")
                and p["config"]["precision"] == "bf16" and p["config"]["attention"] == "math"
                and int(p["config"]["seq_len"]) == 2048]
        assert p["config"]["hyper"]["n_layer"] == n_layer
        return p["breakdown_at_peak"]["activations"]

    (row,) = [r for r in rows if r[:2] == ["tiny-qwen2", "2048"]]
    assert float(row[5].replace(",", "")) == pytest.approx((act(3) - act(2)) / MiB, abs=0.05)
    left = next(l for l in text.splitlines() if l.startswith("Left out of this comparison"))
    assert "tiny-gemma2 (memtrade refuses attention flash" in left and "tiny-mixtral (a mixture" in left


def test_what_memtrade_refuses_is_said_and_left_out(config_page):
    d, (qwen, gemma, moe) = config_page
    text = (d / "docs" / "atlas.md").read_text()
    assert re.search(r'^- tiny-gemma2, `attention = flash`: "attention: flash attention .*Gemma 2', text, re.M)
    assert re.search(r"^- tiny-mixtral, `tensor_parallel = 2`: .*mixture-of-experts", text, re.M)
    # Gemma 2's own tables have math rows only; the tables of one flash setting run it with math,
    # marked; its tensor parallelism and the experts' stop at tp 1.
    sec = text.split("### tiny-gemma2", 1)[1].split("\n### ", 1)[0]
    head, rows = table(sec, "**Table")
    assert rows and {r[1] for r in rows} == {"checkpoint 0 · math", "checkpoint 1 · math"}
    dp_cap = next(l for l in text.splitlines() if l.startswith("**Table") and "per GPU, GiB" in l)
    head, rows = table(text, dp_cap)
    assert {r[0] for r in rows} >= {"tiny-gemma2 (math)", "tiny-qwen2", "tiny-mixtral"}
    assert all(c != "—" for r in rows for c in r[3:])
    tp_cap = next(l for l in text.splitlines() if l.startswith("**Table") and "throughput" in l)
    head, rows = table(text, tp_cap)
    tps = {}
    for r in rows:
        tps.setdefault(r[0], set()).add(r[2])
    assert tps["tiny-gemma2 (math)"] == tps["tiny-mixtral"] == {"1"} and tps["tiny-qwen2"] == {"1", "2"}


def test_mixture_of_experts_says_its_routing(config_page, memtrade_bin):
    d, (qwen, gemma, moe) = config_page
    text = (d / "docs" / "atlas.md").read_text()
    assert "**tiny-mixtral is a mixture of experts** (4 experts, top 2 per token, in 3 layers)" in text
    assert "assumes **balanced routing**" in text
    # The fit cells of a file's model are `memtrade fit --model-config`'s.
    sec = text.split("### tiny-mixtral", 1)[1].split("\n### ", 1)[0]
    cap = next(l for l in sec.splitlines() if l.startswith("**Table") and "largest batch" in l)
    head, rows = table(sec, cap)
    (row,) = [r for r in rows if r[0] == "2048" and r[1] == "checkpoint 1 · flash"]
    out = d / "fit.json"
    subprocess.run([memtrade_bin, "fit", "--backend", "cuda", "--model-config", str(moe), "--seq-len",
                    "2048", "--precision", "bf16", "--optimizer", "adamw", "--checkpoint", "1",
                    "--attention", "flash", "--capacity", "24GiB", "--json", str(out)],
                   check=True, capture_output=True)
    (fit,) = json.loads(out.read_text())["rows"]
    assert int(row[head.index("24GiB card")]) == fit["max_batch"] > 0
