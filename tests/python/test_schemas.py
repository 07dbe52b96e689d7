"""The JSON Schemas in schemas/ are the contracts of memtrade's files: every file memtrade writes
validates against its schema (real output of run, merge, estimate --json, fit --json and traces,
not fixtures), and files written before this version (the committed baseline) still do."""
import json
import pathlib
import subprocess

import pytest

jsonschema = pytest.importorskip("jsonschema")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMAS = {p.name.split(".")[0]: json.loads(p.read_text())
           for p in (ROOT / "schemas").glob("*.schema.json")}


def validate(kind, doc):
    jsonschema.Draft202012Validator.check_schema(SCHEMAS[kind])
    jsonschema.Draft202012Validator(SCHEMAS[kind]).validate(doc)


def run(binary, *args, ok=(0,)):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    assert r.returncode in ok, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def grid_results(memtrade_bin, tmp_path_factory):
    """A small grid with an ok, an oom and a skipped point, in two shards, merged."""
    tmp = tmp_path_factory.mktemp("schemas")
    grid = tmp / "g.toml"
    grid.write_text('name = "schemas"\n[run]\nwarmup = 1\nsteps = 2\ncapacity = "24MiB"\n'
                    '[axes]\nmodel = ["mlp-tiny", "gpt-tiny"]\nbatch_size = [2, 4096]\n'
                    'precision = ["fp32", "tf32"]\n')
    shards = []
    for i in range(2):
        out = tmp / f"shard-{i}.json"
        run(memtrade_bin, "run", "--grid", str(grid), "--backend", "cpu", "--shard", f"{i}/2",
            "--quiet", "--out", str(out))
        shards.append(out)
    merged = tmp / "merged.json"
    run(memtrade_bin, "merge", *map(str, shards), "--grid", str(grid), "-o", str(merged))
    return [json.loads(p.read_text()) for p in shards + [merged]]


def test_run_and_merge_output_validate(grid_results):
    statuses = set()
    for doc in grid_results:
        validate("results", doc)
        statuses |= {p["status"] for p in doc["points"]}
    assert {"ok", "oom", "skipped"} <= statuses
    knobs = grid_results[-1]["meta"]["knobs"]
    assert [k["name"] for k in knobs][:2] == ["model", "batch_size"]


def test_schema_rejects_what_it_should(grid_results):
    doc = json.loads(json.dumps(grid_results[-1]))
    ok = next(p for p in doc["points"] if p["status"] == "ok")
    ok["memory"]["peak_allocated"] = -1
    with pytest.raises(jsonschema.ValidationError):
        validate("results", doc)
    ok["memory"]["peak_allocated"] = 1
    del ok["time"]
    with pytest.raises(jsonschema.ValidationError):  # an ok point must have its figures
        validate("results", doc)


def test_trace_estimate_and_fit_validate(memtrade_bin, tmp_path):
    trace = tmp_path / "trace.json"
    run(memtrade_bin, "run", "--model", "gpt-tiny", "--batch-size", "2", "--steps", "1",
        "--warmup", "0", "--quiet", "--trace", str(trace), "--out", str(tmp_path / "r.json"))
    validate("trace", json.loads(trace.read_text()))
    est = json.loads(run(memtrade_bin, "estimate", "--model", "gpt-mini", "--precision", "bf16",
                         "--capacity", "1MiB", "--json"))
    validate("estimate", est)
    assert est["points"][0]["fits"] is False and est["points"][0]["config"]["hyper"]["num_params"]
    timed = json.loads(run(memtrade_bin, "estimate", "--model", "gpt-mini", "--precision", "bf16",
                           "--gpu", "h100", "--json"))
    validate("estimate", timed)
    assert timed["gpu"] == "h100" and timed["points"][0]["time_model"]["step_s"] > 0
    fit = tmp_path / "fit.json"
    run(memtrade_bin, "fit", "--model", "mlp-tiny", "--capacity", "8MiB", "--json", str(fit))
    validate("fit", json.loads(fit.read_text()))


def test_files_written_before_this_version_still_validate():
    validate("results", json.loads((ROOT / "ci" / "baselines" / "cpu-smoke.json").read_text()))


def test_advise_validates(memtrade_bin, tmp_path):
    cal = str(tmp_path / "cal.json")
    common = ["advise", "--backend", "cpu", "--model", "gpt-tiny", "--steps", "2", "--threads", "1",
              "--calibration", cal, "--json"]
    doc = json.loads(run(memtrade_bin, *common, "--capacity", "2MiB", "--confirm", "1"))
    validate("advise", doc)
    assert doc["recommended"]["config"]["hyper"]["num_params"] and doc["confirmed"][0]["status"] == "ok"
    none = json.loads(run(memtrade_bin, *common, "--capacity", "300KiB", ok=(1,)))
    validate("advise", none)
    assert none["recommended"] is None and none["nothing_fits"]["changes"]
    bad = json.loads(json.dumps(doc))
    del bad["recommended"]["config"]["batch_size"]
    with pytest.raises(jsonschema.ValidationError):  # a recommendation one could not run again
        validate("advise", bad)
    bad = json.loads(json.dumps(doc))
    bad["recommended"]["fits"] = False
    with pytest.raises(jsonschema.ValidationError):
        validate("advise", bad)


def test_advise_on_a_gpu_validates(memtrade_bin):
    doc = json.loads(run(memtrade_bin, "advise", "--model", "gpt-tiny", "--gpu", "h100", "--gpus", "2",
                         "--global-batch", "8", "--json"))
    validate("advise", doc)
    assert doc["gpu"] == "h100" and doc["gpus"] == 2 and doc["cost_model"]["kind"] == "time-model"
    assert all(p["time_model"]["gpus"] == 2 for p in doc["frontier"])
    bad = json.loads(json.dumps(doc))
    del bad["cost_model"]["gpu"]  # a time model names its card
    with pytest.raises(jsonschema.ValidationError):
        validate("advise", bad)
