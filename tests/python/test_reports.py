"""Tests of the reports package (python3 -m reports): pure analysis, every chart from the
fixtures (normal grid, empty, all-OOM), the index page's links, and bad input -> exit 2.
The knob table comes from the memtrade binary (conftest.py), as it does for real reports of
results files that predate meta.knobs (the fixtures)."""

import json
import pathlib
import re
import sqlite3
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from reports import analysis as A  # noqa: E402
from reports import charts as C  # noqa: E402
from reports import knobs  # noqa: E402
from reports import load  # noqa: E402
from reports import build_report  # noqa: E402

FIX = ROOT / "reports" / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# Hand-made points


def mk(model="m", batch=8, status="ok", peak=None, thr=None, **knobs):
    defaults = {k: A.K.default(k) for k in A.setting_knobs()}
    cfg = {"model": model, "batch_size": batch, **defaults, **knobs}
    p = {"id": "/".join(f"{k}={cfg[k]}" for k in sorted(cfg)), "config": cfg, "status": status, "error": None,
         "memory": None, "time": None, "throughput": None}
    if status == "ok":
        p["memory"] = {"peak_allocated": peak, "breakdown_at_peak": {"params": peak // 2, "activations": peak // 2},
                       "predicted_peak": None}
        p["time"] = {"median_s": batch / thr, "samples_s": [batch / thr]}
        p["throughput"] = {"samples_per_s": thr}
    return p


# ---------------------------------------------------------------------------------------------
# pareto_front


def test_pareto_dominance():
    pts = [(10, 100), (8, 120), (12, 90), (20, 200), (15, 150)]
    # (8,120) dominates (10,100) and (12,90); then 150 at 15 and 200 at 20 each buy more throughput
    assert A.pareto_front(pts) == [1, 4, 3]


def test_pareto_one_point_better_in_both():
    pts = [(10, 50), (5, 100), (7, 80), (6, 99)]
    assert A.pareto_front(pts) == [1]


def test_pareto_ties():
    # exact duplicates of a front point are both kept; same memory less throughput is dominated;
    # same throughput more memory is dominated
    pts = [(4, 10), (4, 10), (4, 9), (5, 10), (6, 12)]
    assert A.pareto_front(pts) == [0, 1, 4]


def test_pareto_edge_cases():
    assert A.pareto_front([]) == []
    assert A.pareto_front([(1, 1)]) == [0]
    assert A.pareto_front([(None, 5), (2, float("nan")), (3, 1)]) == [2]


def test_pareto_on_result_points():
    pts = [mk(peak=100, thr=10.0, precision="fp32"), mk(peak=60, thr=20.0, precision="bf16"),
           mk(peak=40, thr=5.0, checkpoint="1"), mk(status="oom")]
    assert A.pareto_front(pts) == [2, 1]


# ---------------------------------------------------------------------------------------------
# knob_effects and baselines


def grid():
    base = mk(peak=1000, thr=100.0)
    return base, [
        base,
        mk(peak=600, thr=250.0, precision="bf16"),             # saves 40%, loses -150%
        mk(peak=500, thr=75.0, checkpoint="1"),                # saves 50%, loses 25%
        mk(peak=700, thr=50.0, precision="bf16", checkpoint="1"),  # two knobs: not a knob effect
        mk(status="oom", batch=64),                            # one knob, oom
        mk(model="other", peak=1000, thr=100.0),               # differs in model only
    ]


def test_knob_effects_single_knob_changes():
    base, pts = grid()
    same_model = [p for p in pts if p["config"]["model"] == "m"]
    rows = A.knob_effects(same_model, base)
    by = {(r["knob"], str(r["value"])): r for r in rows}
    assert set(by) == {("precision", "bf16"), ("checkpoint", "1"), ("batch_size", "64")}
    assert by[("precision", "bf16")]["mem_saved_pct"] == pytest.approx(40.0)
    assert by[("precision", "bf16")]["thr_lost_pct"] == pytest.approx(-150.0)
    assert by[("checkpoint", "1")]["mem_saved_pct"] == pytest.approx(50.0)
    assert by[("checkpoint", "1")]["thr_lost_pct"] == pytest.approx(25.0)
    oom = by[("batch_size", "64")]
    assert oom["status"] == "oom" and oom["mem_saved_pct"] is None and oom["thr_lost_pct"] is None


def test_knob_effects_of_a_language_model_are_in_tokens():
    """Issue 27: a shorter sequence is more samples of fewer tokens, not a throughput gain. In
    tokens/s, seq 16 at 4x the samples/s of seq 64 loses nothing; in samples/s it would be -300%."""
    def lm(seq, thr, **knobs):
        p = mk(model="gpt", peak=1000 * seq, thr=thr, **knobs)
        p["config"]["hyper"] = {"seq_len": seq}
        return p
    base = lm(64, 100.0)
    short = lm(16, 400.0, seq_len=16)
    slow = lm(64, 50.0, checkpoint="1")
    by = {r["knob"]: r for r in A.knob_effects([base, short, slow], base)}
    assert A.rate(base) == (6400.0, "tok/s") and by["seq_len"]["rate_unit"] == "tok/s"
    assert by["seq_len"]["thr_lost_pct"] == pytest.approx(0.0)
    assert by["checkpoint"]["thr_lost_pct"] == pytest.approx(50.0)
    # MLP and CNN (no seq_len) stay in samples/s.
    assert A.rate(mk(peak=1, thr=3.0)) == (3.0, "samples/s")


def test_knob_effects_baseline_missing_or_bad():
    base, pts = grid()
    with pytest.raises(ValueError, match="no baseline"):
        A.knob_effects(pts, None)
    with pytest.raises(ValueError, match="not an ok point"):
        A.knob_effects(pts, mk(status="oom"))
    # a baseline nobody differs from in exactly one knob: empty
    lone = mk(model="z", peak=1, thr=1.0, optimizer="sgd", precision="fp16")
    assert A.knob_effects(pts, lone) == []


def test_default_baselines():
    base, pts = grid()
    b = A.default_baselines(pts)
    assert b["m"] is base and b["other"]["config"]["model"] == "other"
    assert A.default_baselines([mk(peak=1, thr=1.0, precision="bf16")]) == {}
    assert A.default_baselines([]) == {}


def test_checkpoint_normalisation_and_labels():
    assert A.norm_checkpoint(0) == "0" and A.norm_checkpoint("0.50") == "0.5" and A.norm_checkpoint("sqrt") == "sqrt"
    cfg = mk(peak=1, thr=1.0, precision="bf16", checkpoint="0.5")["config"]
    # Labels read like point ids: the knob table's prefixes, in id order.
    assert A.short_label(cfg, ["precision", "checkpoint", "optimizer", "batch_size"]) == "b8 bf16 ck0.5 adam"
    # By default a label names the workload and every knob turned away from its default.
    assert A.short_label(cfg) == "m b8 bf16 ck0.5"
    cfg2 = mk(peak=1, thr=1.0, offload="activations")["config"]
    varying = ["precision", "offload", "batch_size"]
    assert A.compact_label(cfg, varying) == "b8 bf16"
    assert A.compact_label(cfg2, varying) == "b8 off-activations"
    assert A.short_label(mk(peak=1, thr=1.0, mode="eval")["config"]) == "m b8 eval"


def test_autocast_policy_tells_only_autocast_points_apart():
    cuda = mk(peak=1, thr=1.0, precision="bf16")
    cpu = mk(peak=1, thr=1.0, precision="bf16", autocast_policy="torch-cpu")
    assert A.varying_knobs([cuda, cpu]) == ["autocast_policy"]
    assert A.compact_label(cpu["config"], ["precision", "autocast_policy"]) == "bf16 ac-torch-cpu"


# ---------------------------------------------------------------------------------------------
# Capacity fits, units, traces


def test_largest_batch_fitting():
    # peak = 1 GiB + 0.5 GiB * batch
    bs = [4, 8, 16]
    pk = [A.GiB + 0.5 * A.GiB * b for b in bs]
    assert A.largest_batch_fitting(bs, pk, 16 * A.GiB) == 30
    assert A.largest_batch_fitting(bs, pk, A.GiB) == 0
    assert A.largest_batch_fitting([8], [A.GiB], 16 * A.GiB) is None
    assert A.largest_batch_fitting([4, 8], [2.0, 1.0], 10.0) is None


def test_memory_unit():
    assert A.memory_unit(3 * A.GiB) == ("GiB", A.GiB)
    assert A.memory_unit(300 * A.MiB) == ("MiB", A.MiB)
    assert A.memory_unit(5000) == ("KiB", A.KiB)


def test_trace_timeline_reconstructs_live_bytes():
    ev = [
        {"seq": 0, "kind": "segment_alloc", "bytes": 100, "category": "params", "phase": "io", "allocated": 0, "reserved": 100},
        {"seq": 1, "kind": "alloc", "bytes": 10, "category": "params", "phase": "io", "allocated": 10, "reserved": 100},
        {"seq": 2, "kind": "alloc", "bytes": 30, "category": "activations", "phase": "forward", "allocated": 40, "reserved": 100},
        {"seq": 3, "kind": "alloc", "bytes": 5, "category": "temporaries", "phase": "forward", "allocated": 45, "reserved": 100},
        {"seq": 4, "kind": "free", "bytes": 30, "category": "activations", "phase": "backward", "allocated": 15, "reserved": 100},
        {"seq": 5, "kind": "oom", "bytes": 999, "category": "activations", "phase": "backward", "allocated": 15, "reserved": 100},
    ]
    tl = A.trace_timeline(ev)
    live = dict(zip(tl["categories"], tl["live"]))
    assert live["params"] == [0, 10, 10, 10, 10, 10]
    assert live["activations"] == [0, 0, 30, 30, 0, 0]
    assert live["temporaries"] == [0, 0, 0, 5, 5, 5]
    assert [p[0] for p in tl["phases"]] == ["io", "forward", "backward"]
    assert tl["ooms"] == [5]


# ---------------------------------------------------------------------------------------------
# Loading


def test_fixtures_validate():
    doc = load.load_results(FIX / "grid.json")
    assert len(doc["points"]) >= 20
    assert any(p["status"] == "oom" for p in doc["points"])
    assert load.load_results(FIX / "empty.json")["points"] == []
    assert all(p["status"] == "oom" for p in load.load_results(FIX / "all-oom.json")["points"])
    assert load.load_trace(FIX / "trace.json")["events"]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="memtrade.results/9"), "schema"),
    (lambda d: d.update(points={}), "points"),
    (lambda d: d["points"][0].update(status="great"), "status"),
    (lambda d: d["points"][0]["memory"].update(peak_allocated="big"), "peak_allocated"),
    (lambda d: d["points"][0]["config"].pop("model"), "config"),
])
def test_validation_errors(mutate, message):
    doc = json.loads((FIX / "grid.json").read_text())
    mutate(doc)
    with pytest.raises(load.InputError, match=message):
        load.validate_results(doc, "x.json")


# ---------------------------------------------------------------------------------------------
# Rendering: full reports from the fixtures


def history_db(tmp: pathlib.Path) -> pathlib.Path:
    db = tmp / "history.db"
    con = sqlite3.connect(db)
    con.executescript((FIX / "history.sql").read_text())
    con.commit()
    con.close()
    return db


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Full reports (png+svg) from the grid (with baseline, history and trace), empty and all-OOM files."""
    tmp = tmp_path_factory.mktemp("reports")
    db = history_db(tmp)
    out = {}
    for name, res, extra in [
        ("grid", FIX / "grid.json", dict(baseline=str(FIX / "baseline.json"), history=str(db),
                                         traces=[str(FIX / "trace.json")])),
        ("empty", FIX / "empty.json", dict(baseline=str(FIX / "grid.json"), history=str(db))),
        ("all-oom", FIX / "all-oom.json", dict(baseline=str(FIX / "all-oom.json"),
                                               traces=[str(FIX / "trace.json")])),
    ]:
        d = tmp / name
        charts = build_report([str(res)], d, strict=True, **extra)
        out[name] = (d, charts)
    return out


def check_image(path: pathlib.Path):
    data = path.read_bytes()
    assert len(data) > 1000, path
    if path.suffix == ".png":
        assert data.startswith(PNG_MAGIC), path
    else:
        assert b"<svg" in data[:2000], path


def test_grid_draws_every_chart(reports):
    d, charts = reports["grid"]
    drawn = {c.key for c in charts if c.files}
    assert drawn == {"frontier", "knob-effects", "breakdown", "checkpoint", "batch", "predicted", "timeline",
                     "history", "compare"}, [(c.key, c.skipped) for c in charts]
    assert next(c for c in charts if c.key == "inference").skipped  # the fixture has no eval point
    for c in charts:
        if c.key not in drawn:  # the fixture grid has no eval point and no sequence-length sweep
            assert c.key in ("inference", "seq-len") and c.skipped, (c.key, c.skipped)
            continue
        assert sorted(pathlib.Path(f).suffix for f in c.files) == [".png", ".svg"]
        for f in c.files:
            check_image(d / f)
        assert c.rows, f"{c.key} has no table"
    # The page says what the labels' knobs mean, for the axes that vary, from the knob table.
    page = (d / "index.md").read_text()
    points = json.loads((FIX / "grid.json").read_text())["points"]
    varying = {a for a in knobs.names() if len({json.dumps(p["config"].get(a)) for p in points}) > 1}
    assert varying and all(f"- **{a}**: {knobs.row(a)['help']}" in page for a in varying)
    assert "- **model_config**" not in page


def test_frontier_table_is_pareto(reports):
    _, charts = reports["grid"]
    fr = next(c for c in charts if c.key == "frontier")
    doc = load.load_results(FIX / "grid.json")
    for model in {p["config"]["model"] for p in doc["points"]}:
        pts = [p for p in A.ok_points(doc["points"]) if p["config"]["model"] == model]
        assert sum(r[1] == model for r in fr.rows) == len(A.pareto_front(pts))


@pytest.mark.parametrize("name", ["empty", "all-oom"])
def test_thin_inputs_render_or_skip(reports, name):
    d, charts = reports[name]
    for c in charts:
        assert c.files or c.skipped, c.key
        assert not (c.skipped or "").startswith("failed"), c.skipped
        for f in c.files:
            check_image(d / f)
    if name == "all-oom":  # the frontier says "no ok points" in a figure and lists the OOM points
        fr = next(c for c in charts if c.key == "frontier")
        assert fr.files and len(fr.rows) == 3
    else:
        assert not any(c.files for c in charts if c.key != "history")
    html = (d / "index.html").read_text()
    assert "Not drawn" in html
    assert "no ok points" in html.lower() or "no points" in html.lower()


def test_each_chart_function_on_thin_data(tmp_path):
    """Each chart function directly, on empty and all-OOM point lists: draws or skips, never raises."""
    meta = {"capacity": None}
    oom = load.load_results(FIX / "all-oom.json")["points"]
    for pts in ([], oom):
        for fn in (lambda: C.frontier(pts, meta, tmp_path, ["png"]),
                   lambda: C.knob_effects(pts, tmp_path, ["png"]),
                   lambda: C.breakdown(pts, tmp_path, ["png"]),
                   lambda: C.checkpoint_curve(pts, tmp_path, ["png"]),
                   lambda: C.batch_scaling(pts, meta, tmp_path, ["png"]),
                   lambda: C.predicted(pts, tmp_path, ["png"]),
                   lambda: C.baseline_vs_head({"points": pts, "meta": {}}, {"points": pts, "meta": {}},
                                              tmp_path, ["png"])):
            c = fn()
            assert c.files or c.skipped
    assert C.timeline({"events": []}, tmp_path, ["png"]).skipped
    assert C.history_trend({"runs": [], "points": []}, tmp_path, ["png"]).skipped


def test_single_ok_point_renders(tmp_path):
    one = [mk(peak=3 * A.MiB, thr=12.5)]
    for c in (C.frontier(one, {"capacity": None}, tmp_path, ["png"]), C.breakdown(one, tmp_path, ["png"])):
        assert c.files
        check_image(tmp_path / c.files[0])


# ---------------------------------------------------------------------------------------------
# The page links only files that exist


LINK_RE = {
    "html": re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']"""),
    "md": re.compile(r"\]\(([^)\s]+)\)"),
}


@pytest.mark.parametrize("name", ["grid", "empty", "all-oom"])
def test_page_links_exist(reports, name):
    d, charts = reports[name]
    for page, kind in (("index.html", "html"), ("index.md", "md")):
        text = (d / page).read_text()
        links = [u for u in LINK_RE[kind].findall(text) if not u.startswith("#")]
        for u in links:
            assert "://" not in u, u
            assert (d / u).is_file() and (d / u).stat().st_size > 0, f"{page} links missing {u}"
        for c in charts:
            for f in c.files:
                assert f in links, f"{page} does not embed {f}"
    html = (d / "index.html").read_text()
    assert "<style>" in html and "stylesheet" not in html
    meta = json.loads((FIX / f"{'grid' if name == 'grid' else name}.json").read_text())["meta"]
    assert str(meta["commit"]) in html and str(meta["device"]) in html


# ---------------------------------------------------------------------------------------------
# The CLI: bad input -> exit 2 with one line on stderr


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "reports", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def bad_files(tmp: pathlib.Path):
    (tmp / "malformed.json").write_text('{"schema": "memtrade.results/1", "points": [')
    (tmp / "schema.json").write_text('{"schema": "something.else/1", "points": []}')
    (tmp / "array.json").write_text("[1, 2, 3]")
    doc = json.loads((FIX / "grid.json").read_text())
    doc["points"][0]["memory"] = None
    (tmp / "okpoint.json").write_text(json.dumps(doc))
    (tmp / "notadb.db").write_text("hello")
    return tmp


@pytest.mark.parametrize("args, needle", [
    (["{t}/malformed.json"], "malformed JSON"),
    (["{t}/schema.json"], "schema"),
    (["{t}/array.json"], "schema"),
    (["{t}/okpoint.json"], "memory"),
    (["{t}/missing.json"], "no such file"),
    (["{fix}/grid.json", "--trace", "{fix}/grid.json"], "memtrade.trace/1"),
    (["{fix}/grid.json", "--history", "{t}/notadb.db"], "history"),
    (["{fix}/grid.json", "--formats", "gif"], "gif"),
    (["{fix}/grid.json", "--baseline-point", "nope"], "nope"),
    (["{fix}/grid.json", "--no-such-flag"], "no-such-flag"),
])
def test_cli_bad_input_exit_2(tmp_path, args, needle):
    t = bad_files(tmp_path)
    argv = [a.format(t=t, fix=FIX) for a in args] + ["-o", str(tmp_path / "out")]
    r = run_cli(*argv)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "index.html").exists()


def test_cli_runs_on_fixture(tmp_path):
    r = run_cli(FIX / "grid.json", "--formats", "svg", "--title", "fixture report", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "out" / "index.html").read_text()
    assert "fixture report" in html and "frontier.svg" in html
    assert not list((tmp_path / "out").glob("*.png"))


def test_crowded_grid_is_limited(tmp_path):
    """60 points: breakdown keeps 30 bars (Pareto points included), frontier numbers its labels."""
    pts = [mk(batch=b, peak=(b + 10) * A.MiB * (1 + (k % 3)), thr=50.0 * b / (b + 4) + k,
              precision=["fp32", "bf16", "fp16"][k % 3], checkpoint=["0", "0.5", "1"][k // 3 % 3])
           for k in range(3) for b in range(1, 21)]
    fr = C.frontier(pts, {"capacity": None}, tmp_path, ["png"])
    assert fr.files and len(fr.rows) == len(A.pareto_front(pts))
    bd = C.breakdown(pts, tmp_path, ["png"])
    assert len(bd.rows) == C.MAX_BARS
    front_labels = {A.compact_label(pts[i]["config"], A.label_knobs(pts)) for i in A.pareto_front(pts)}
    assert front_labels <= {r[0] for r in bd.rows}


# ---------------------------------------------------------------------------------------------
# Inference points and labels (what the page showed when opened in a browser)


def test_eval_points_get_their_own_panel(tmp_path):
    base = mk(model="m", peak=10 * A.MiB, thr=100.0)
    ck = mk(model="m", peak=8 * A.MiB, thr=80.0, checkpoint="1")
    ev = mk(model="m", peak=2 * A.MiB, thr=340.0, mode="eval")  # on a shared frontier it would rule
    pts = [base, ck, ev]
    fr = C.frontier(pts, {"capacity": None}, tmp_path, ["png"])
    assert all("eval" not in r[2] for r in fr.rows), fr.rows
    assert len(fr.rows) == 2 and any("inference" in n for n in fr.notes)
    ke = C.knob_effects(pts, tmp_path, ["png"])
    assert [r[1] for r in ke.rows] == ["checkpoint"], ke.rows  # no -240 % mode row
    inf = C.inference(pts, tmp_path, ["png"])
    assert inf.files and len(inf.rows) == 1
    assert inf.rows[0][0] == "m b8 eval" and inf.rows[0][3] == "m b8"
    check_image(tmp_path / inf.files[0])
    assert C.inference([base, ck], tmp_path, ["png"]).skipped


def test_frontier_labels_name_every_knob_turned(tmp_path):
    # One point per model: nothing varies along the fronts, yet the turned knob is named.
    a = mk(model="a", peak=4 * A.MiB, thr=50.0, offload="optimizer")
    b = mk(model="b", peak=9 * A.MiB, thr=30.0)
    fr = C.frontier([a, b], {"capacity": None}, tmp_path, ["png"])
    labels = {r[1]: r[2] for r in fr.rows}
    assert labels["a"] == "off-optimizer" and labels["b"] == "b"
    assert A.turned_label(a["config"], b["config"]) == "a off-optimizer"
    assert A.turned_label(b["config"], b["config"]) == "as is"


# ---------------------------------------------------------------------------------------------
# memtrade advise --json: the frontier chart with the capacity line and the chosen point


def test_advise_chart_from_real_output(memtrade_bin, tmp_path):
    out = subprocess.run([memtrade_bin, "advise", "--backend", "cpu", "--model", "gpt-tiny", "--capacity", "2MiB",
                          "--steps", "2", "--threads", "1", "--calibration", str(tmp_path / "cal.json"), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (tmp_path / "advise.json").write_text(out.stdout)
    charts = build_report([], tmp_path / "page", advise=[str(tmp_path / "advise.json")], formats=["png"],
                          strict=True)
    (c,) = charts
    assert c.key == "advise" and c.files and c.rows
    check_image(tmp_path / "page" / c.files[0])
    doc = json.loads(out.stdout)
    assert sum("(recommended)" in r[4] for r in c.rows) == (1 if any(
        p["id"] == doc["recommended"]["id"] for p in doc["frontier"]) else 0)
    assert any(n.startswith("Recommended:") for n in c.notes)
    assert (tmp_path / "page" / "index.html").read_text().count("advise.png") >= 1
    # Through the CLI, next to a results file; and bad input is exit 2.
    r = subprocess.run([sys.executable, "-m", "reports", "--advise", str(tmp_path / "missing.json"), "-o",
                        str(tmp_path / "x")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "no such file" in r.stderr
    r = subprocess.run([sys.executable, "-m", "reports", "-o", str(tmp_path / "x")], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 2


def test_advise_chart_on_a_gpu_shows_tokens_per_gpu_and_mfu(memtrade_bin, tmp_path):
    """A language model's throughput is tokens/s per GPU with its MFU (the time model's); an MLP's
    stays samples/s."""
    from reports import advise as ADV
    out = subprocess.run([memtrade_bin, "advise", "--model", "gpt-tiny", "--gpu", "h100", "--gpus", "2",
                          "--global-batch", "8", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    chart = ADV.frontier(doc, tmp_path, ["png"])
    assert chart.headers[2:4] == ["tok/s/GPU", "MFU"]
    seq = doc["start"]["config"]["hyper"]["seq_len"]
    for row, p in zip(chart.rows, doc["frontier"]):
        t = p["time_model"]
        assert t["gpus"] == 2 and row[3] == f"{100 * t['mfu']:.1f}%"
        assert ADV.throughput(doc, p) == pytest.approx(t["tokens_per_s_per_gpu"], rel=1e-12)
        assert ADV.throughput(doc, p) == pytest.approx(p["predicted_samples_per_s"] / 2 * seq, rel=1e-12)
    assert "time model of h100" in ADV.throughput_label(doc)
    mlp = json.loads(subprocess.run([memtrade_bin, "advise", "--model", "mlp-tiny", "--gpu", "h100", "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    assert ADV.throughput_unit(mlp) == "samples/s"
    assert ADV.throughput(mlp, mlp["start"]) == mlp["start"]["predicted_samples_per_s"]


def test_seq_len_curve_measured_and_predicted(tmp_path):
    """Points differing only in seq_len make lines (x = the tokens actually trained, from hyper);
    estimate documents make the predicted panel; math and flash are separate lines."""
    def pt(t, attention, peak):
        p = mk(model="gpt", peak=peak, thr=1.0, seq_len=0 if t == 64 else t, attention=attention)
        p["config"]["hyper"] = {"seq_len": t}
        return p
    pts = [pt(t, a, t * t * (4 if a == "math" else 1) + 1000) for t in (16, 32, 64)
           for a in ("math", "flash")]
    est = {"schema": "memtrade.estimate/1", "backend": "cuda", "capacity": None,
           "points": [{"id": f"e{t}{a}", "config": {**q["config"]}, "peak_allocated": q["memory"]["peak_allocated"] * 2}
                      for q in pts for t, a in [(q["config"]["hyper"]["seq_len"], q["config"]["attention"])]]}
    chart = C.seq_len_curve(pts, [est], tmp_path, ["png"])
    assert chart.files == ["seq-len.png"]
    lines = {r[1] for r in chart.rows}
    assert lines == {"gpt math", "gpt flash"}
    assert {r[0] for r in chart.rows} == {"measured", "predicted"}
    assert sorted(int(r[2]) for r in chart.rows if r[:2] == ["measured", "gpt math"]) == [16, 32, 64]
    assert C.seq_len_curve(pts[:1], [], tmp_path, ["png"]).skipped


# ---------------------------------------------------------------------------------------------
# The commit trend marks the history's change points (memtrade history changes)


def test_commit_trend_marks_change_points(memtrade_bin, tmp_path, monkeypatch):
    run = subprocess.run([memtrade_bin, "run", "--backend", "cpu", "--model", "mlp-tiny", "--steps", "2",
                          "--warmup", "0", "--quiet", "--out", str(tmp_path / "r.json")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    base = json.loads((tmp_path / "r.json").read_text())
    db = tmp_path / "h.db"
    for night in range(8):  # peak memory +1 MiB from night 5 on: one regression
        doc = json.loads(json.dumps(base))
        doc["meta"]["commit"] = f"commit{night}"
        doc["meta"]["time"] = f"2026-11-{night + 1:02}T02:00:00Z"
        if night >= 5:
            doc["points"][0]["memory"]["peak_allocated"] += 1 << 20
        (tmp_path / "n.json").write_text(json.dumps(doc))
        r = subprocess.run([memtrade_bin, "history", "add", str(tmp_path / "n.json"), "--db", str(db)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    monkeypatch.setenv("MEMTRADE_BIN", memtrade_bin)
    hist = load.load_history(db)
    assert [(c["commit"], c["direction"], c["metric"]) for c in hist["changes"]] == [
        ("commit5", "regression", "peak_allocated")]
    chart = C.history_trend(hist, tmp_path, ["png"])
    assert any("Change points (memtrade history changes, triangles): 1: regression of +" in n and "commit5" in n
               for n in chart.notes), chart.notes
    monkeypatch.delenv("MEMTRADE_BIN")
    assert any("Change points not drawn" in n for n in C.history_trend(load.load_history(db), tmp_path,
                                                                         ["png"]).notes)


def test_frontier_reads_language_models_in_tokens(tmp_path):
    """Issue 27: the frontier's axis and table put a language model's throughput in tokens/s and
    take its front in that unit: seq 16 at 4x the samples/s of seq 64 is as fast, not faster, so
    the point of more memory at the same tokens/s leaves the front."""
    def lm(seq, peak, thr, **knobs):
        p = mk(model="gpt", peak=peak * A.MiB, thr=thr, **knobs)
        p["config"]["hyper"] = {"seq_len": seq}
        return p
    long_ = lm(64, 10, 100.0)                  # 6,400 tok/s
    short = lm(16, 4, 380.0, seq_len=16)       # 6,080 tok/s: less memory, a little slower
    ck = lm(64, 12, 90.0, checkpoint="1")      # more memory and slower: never on the front
    fr = C.frontier([long_, short, ck], {"capacity": None}, tmp_path, ["png"])
    assert fr.headers[4] == "tok/s" and any("tokens/s for language models" in n for n in fr.notes)
    assert [r[4] for r in fr.rows] == ["6,080", "6,400"]  # in samples/s seq 16 (380) would rule alone
    check_image(tmp_path / fr.files[0])
    # MLP and CNN keep samples/s; a page of both says which unit is which in each cell.
    mlp = mk(model="mlp", peak=2 * A.MiB, thr=50.0)
    assert C.frontier([mlp], {"capacity": None}, tmp_path, ["png"]).headers[4] == "samples/s"
    both = C.frontier([long_, mlp], {"capacity": None}, tmp_path, ["png"])
    assert both.headers[4] == "throughput"
    assert {r[1]: r[4] for r in both.rows} == {"gpt": "6,400 tok/s", "mlp": "50 samples/s"}
    assert A.rate_unit([long_, mlp]) == "tok/s for language models, samples/s for MLP and CNN"
