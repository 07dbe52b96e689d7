#!/usr/bin/python3
"""Writes docs/advise.md, "What to turn when you run out of memory": the playbook for CUDA out of
memory (smaller micro-batch with accumulation, checkpointing, offload, flash attention, ...)
quantified by `memtrade advise` for the atlas models on 24, 40 and 80 GiB cards (those a config
file defines, 7B and more, on 80 GiB only), with one chart
per model (the frontier on the smallest card, the capacity line and the chosen point), and the
same workloads on one H100 priced by its time model (`advise --gpu h100`).

    ci/advise_doc.py BUILD/memtrade docs/          (make docs runs it)

Peaks come from the CUDA memory model. Throughputs are what the cost model predicts: measured on
a GPU where advise runs on one, otherwise the CPU-calibrated model, and labelled so.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CARDS_GIB = (24, 40, 80)
# The models a config file defines (reports/atlas.py CONFIG_MODELS: Qwen2.5-7B, Mistral-7B,
# Gemma-2-9B, Mixtral-8x7B) run on the 80 GiB card and the H100 only: at 7B parameters and more,
# bf16 autocast with Adam fits nothing smaller whatever advise turns (llama3-8b's rows show it),
# and each of their runs takes minutes.
CONFIG_CARDS_GIB = (80,)
# The workload: 32 sequences per optimizer step, bf16 autocast (torch.autocast over fp32 weights),
# Adam; GPT-2 at its full context of 1024 tokens, Llama and the config files' models at 4096 (their
# own, 8k-128k, is longer than most fine-tuning runs use); advise keeps all of that and turns the
# rest.
START = ["--precision", "bf16", "--global-batch", "32"]
LLAMA_SEQ = 4096
# The CPU calibration: one thread, CPU time per step, which the other jobs of a shared build
# machine do not inflate.
CALIBRATION = ["--threads", "1", "--clock", "cpu"]
# The same workloads on one card of the GPU table, priced by its time model (no calibration).
GPU = "h100"


def run(binary: str, *args: str) -> tuple[int, str]:
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        sys.exit(f"memtrade {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.returncode, r.stdout


def atlas():
    """reports.atlas, the one list of models; imported once main has set MEMTRADE_BIN (importing
    reports reads the knob table)."""
    from reports import atlas as ATLAS  # noqa: E402
    return ATLAS


def models(binary: str) -> list[str]:
    """The atlas's models that this memtrade knows (a config file's always: memtrade reads it)."""
    table = json.loads(run(binary, "knobs", "--json")[1])
    known = next(k for k in table if k["name"] == "model")["choices"]
    return [m for m in atlas().MODELS if m in known or atlas().model_file(m)]


def cards(model: str) -> tuple[int, ...]:
    return CONFIG_CARDS_GIB if atlas().model_file(model) else CARDS_GIB


def model_args(model: str) -> list[str]:
    """--model (or --model-config) and the sequence length: GPT-2 its own, the others LLAMA_SEQ."""
    long = model.startswith("llama") or atlas().model_file(model)
    return atlas().model_args(model) + (["--seq-len", str(LLAMA_SEQ)] if long else [])


def config_paragraph(names: list[str]) -> list[str]:
    """Which models a Hugging Face config.json defines, where they appear, and the routing their
    mixture-of-experts peaks assume."""
    files = [(m, atlas().CONFIG_MODELS.get(m, m)) for m in names if atlas().model_file(m)]
    if not files:
        return []
    listed = ", ".join(f"{m} (`--model-config {f}`)" for m, f in files)
    return [f"The models {listed} are defined by their Hugging Face config.json. They appear on "
            f"the {' and '.join(map(str, CONFIG_CARDS_GIB))} GiB card and the {GPU.upper()} only: at 7B "
            "parameters and more, bf16 autocast with Adam fits nothing smaller whatever advise turns "
            "(llama3-8b's rows show it). A mixture-of-experts model's activations depend on how its "
            "router spreads the tokens, which the memory model cannot know: its peaks assume "
            "**balanced routing** (each expert receives N·top_k/E of a layer's N tokens; memtrade's "
            "default, `estimate --moe-routing balanced`).", ""]


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    binary, out = argv[1], pathlib.Path(argv[2])
    os.environ.setdefault("MEMTRADE_BIN", binary)
    from reports import advise as ADV  # noqa: E402  (after MEMTRADE_BIN: the knob table)
    from reports import analysis as A  # noqa: E402

    docs: dict[tuple[str, int], dict] = {}
    names = models(binary)
    for m in names:
        for card in cards(m):
            _, text = run(binary, "advise", "--backend", "cuda", *model_args(m), *START,
                          "--capacity", f"{card}GiB", *CALIBRATION, "--json", "--quiet")
            docs[(m, card)] = json.loads(text)
    on_gpu = {}
    for m in names:
        _, text = run(binary, "advise", *model_args(m), *START, "--gpu", GPU, "--json", "--quiet")
        on_gpu[m] = json.loads(text)
    any_doc = next(iter(docs.values()))
    label = ADV.throughput_label(any_doc)
    lines = ["# What to turn when you run out of memory", "",
             "<!-- generated by ci/advise_doc.py (`make docs`); do not edit -->", "",
             "The playbook for `CUDA out of memory` is a list: a smaller micro-batch with gradient "
             "accumulation, activation checkpointing, offload, flash attention, a lighter optimizer, "
             "lower precision. `memtrade advise` answers which of these to turn, and how far, for one "
             "model on one card, with the least throughput lost and the training unchanged (the same "
             "samples per optimizer step, precision and optimizer; `--allow precision,optimizer` opens "
             "those). Below: its picks for the atlas models (GPT-2 at its full 1024-token context, the "
             f"others at {LLAMA_SEQ} tokens), {START[3]} sequences per step, `{START[1]}` autocast and "
             f"Adam, on {', '.join(map(str, CARDS_GIB[:-1]))} and {CARDS_GIB[-1]} GiB "
             f"cards, with a margin of {gib(any_doc['margin'])} for the CUDA context.", "",
             *config_paragraph(names),
             f"Peaks are the CUDA memory model's. Throughputs are {label}: read them relative to each "
             "other (the *throughput vs as given* column: what fitting costs), not as GPU samples per "
             "second. Where such a model is calibrated on the CPU, a host<->device copy is priced at "
             "the CPU's measured memcpy rate, far above what PCIe gives a GPU: offload rows look "
             "cheaper here than they will be on a card, until advise is calibrated there (it does "
             "so on its own with `--backend cuda` on a GPU machine). `as is` means the start fits "
             "and nothing needs turning.", ""]
    for card in CARDS_GIB:
        lines += [f"## {card} GiB", "",
                  "| model | as given | advise turns | peak | throughput vs as given | why |",
                  "|---|---|---|---|---|---|"]
        for m in [m for m in names if (m, card) in docs]:
            d = docs[(m, card)]
            start, rec = d["start"], d["recommended"]
            given = f"{gib(start['predicted_peak'])}" + ("" if start["fits"] else " (does not fit)")
            if rec is None:
                n = d["nothing_fits"]
                lines.append(f"| {m} | {given} | nothing fits: the smallest is "
                             f"{gib(n['smallest']['predicted_peak'])} | – | – | "
                             f"{'; '.join(n['changes'])} |")
                continue
            change = rec["predicted_samples_per_s"] / start["predicted_samples_per_s"] - 1
            why = "; ".join(e["text"] for e in rec["explanation"]) or "–"
            lines.append(f"| {m} | {given} | `{A.turned_label(rec['config'], start['config'])}` | "
                         f"{gib(rec['predicted_peak'])} | {100 * change:+.1f}% | {why} |")
        lines.append("")
    cap = gib(on_gpu[names[0]]["capacity"]) if names else ""
    lines += [f"## On one {GPU.upper()}, priced by its time model", "",
              f"The same workloads with `--gpu {GPU}`: the card's {cap} (less the margin), and every "
              "configuration priced by the time model of docs/time-model.md instead of the CPU "
              "calibration: each op of the dry run at the card's rates, offload copies at its PCIe "
              "bandwidth. Language models' throughput in tokens per second per GPU with the MFU "
              "(PaLM's convention).", "",
              "| model | as given | advise turns | peak | tok/s/GPU | MFU | step | why |",
              "|---|---|---|---|---|---|---|---|"]
    for m in names:
        d = on_gpu[m]
        start, rec = d["start"], d["recommended"]
        given = f"{gib(start['predicted_peak'])}" + ("" if start["fits"] else " (does not fit)")
        if rec is None:
            lines.append(f"| {m} | {given} | nothing fits | – | – | – | – | "
                         f"{'; '.join(d['nothing_fits']['changes'])} |")
            continue
        t = rec["time_model"]
        why = "; ".join(e["text"] for e in rec["explanation"]) or "–"
        lines.append(f"| {m} | {given} | `{A.turned_label(rec['config'], start['config'])}` | "
                     f"{gib(rec['predicted_peak'])} | {t.get('tokens_per_s_per_gpu', 0):,.0f} | "
                     f"{100 * t['mfu']:.1f}% | {t['step_s']:.3g} s | {why} |")
    lines.append("")
    lines += ["## The frontiers on 24 GiB", "",
              "Every configuration advise searched, reduced to its memory/throughput Pareto frontier "
              "(predicted), with the card's capacity, the start as given and the recommended point.", ""]
    for m in [m for m in names if (m, CARDS_GIB[0]) in docs]:
        chart = ADV.frontier(docs[(m, CARDS_GIB[0])], out, ["png"], key=f"advise-{m}")
        if chart.files:
            lines += [f"![{chart.title}]({chart.files[0]})", ""]
    lines += ["Regenerate with `make docs` (or `ci/advise_doc.py build/memtrade docs/`); one configuration "
              "by hand: `memtrade advise --backend cuda --model gpt2-774m --precision bf16 --global-batch 32 "
              "--capacity 24GiB`.", ""]
    (out / "advise.md").write_text("\n".join(lines))
    print(f"{out / 'advise.md'}: {len(docs)} advise runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
