"""docs/advise.md's plan (ci/advise_doc.py): the atlas's one list of models, a config file's model
advised by its file, and advise's CPU calibration of such a model (a proxy of its family) running
where no GPU is."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))
sys.path.insert(0, str(ROOT))

import advise_doc as D  # noqa: E402
from reports import atlas as R  # noqa: E402


def test_the_models_are_the_atlas_list_and_config_files_are_advised_by_their_file(memtrade_bin):
    names = D.models(memtrade_bin)
    assert names == R.MODELS  # every built-in size this memtrade knows, then the config files
    assert D.model_args("gpt2-124m") == ["--model", "gpt2-124m"]
    assert D.model_args("llama3-8b") == ["--model", "llama3-8b", "--seq-len", str(D.LLAMA_SEQ)]
    assert D.model_args("mixtral-8x7b") == ["--model-config", R.model_file("mixtral-8x7b"),
                                            "--seq-len", str(D.LLAMA_SEQ)]
    assert D.cards("llama3-8b") == D.CARDS_GIB and D.cards("qwen2.5-7b") == D.CONFIG_CARDS_GIB
    text = " ".join(D.config_paragraph(names))
    for name, path in R.CONFIG_MODELS.items():
        assert f"{name} (`--model-config {path}`)" in text
    assert "**balanced routing**" in text and D.config_paragraph(R.BUILTIN_MODELS) == []


def test_advise_calibrates_a_config_files_model_on_a_proxy(memtrade_bin, tmp_path):
    # Without a GPU, `advise --backend cuda` measures the cost model on the CPU with a listed
    # model of the family (llama-mini here); the file that defined the advised model must not
    # come along (it did: exit 2, "FILE defines the model: leave --model at its default").
    cfg = {**json.loads((ROOT / "tests/models/fixtures/hf/Qwen2.5-7B.json").read_text()),
           "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 512,
           "max_position_embeddings": 256}
    path = tmp_path / "tiny-qwen2.json"
    path.write_text(json.dumps(cfg))
    r = subprocess.run([memtrade_bin, "advise", "--backend", "cuda", "--model-config", str(path),
                        "--global-batch", "4", "--capacity", "24GiB", "--threads", "1", "--clock",
                        "cpu", "--steps", "1", "--calibration", str(tmp_path / "cal.json"),
                        "--json", "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["recommended"]["config"]["model_config"] == str(path)
    assert "llama-mini" in json.dumps(doc["cost_model"])  # calibrated on the proxy
