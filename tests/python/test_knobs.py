"""The knob table's consumers on the Python side: the reports label every axis the table has
(with the table's own prefixes and defaults), and the PyTorch peer is handed every axis of every
point by memtrade. (The C++ consumers are walked in tests/harness/test_knobs.cpp.)"""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "peers"))

from reports import analysis as A  # noqa: E402
from reports import knobs as K  # noqa: E402


def test_the_report_labels_every_value_of_every_axis(knob_table):
    base = {k["name"]: k["default"] for k in knob_table}
    for k in knob_table:
        for value in k["examples"]:
            cfg = dict(base, **{k["name"]: int(value) if k["type"] == "integer" else value})
            label = A.short_label(cfg)
            turned = str(value) != str(k["default"])
            always = k["workload"] and k["id_rule"] == "always"
            assert (f"{k['id_prefix']}{value}" in label.split()) == (turned or always), (
                k["name"], value, label)
            if turned:  # a single-knob change is a knob effect of that axis
                base_pt = {"id": "base", "config": base}
                assert A.differing_knobs({"config": cfg}, base_pt) == [k["name"]]


def test_axes_missing_from_old_files_read_as_their_default(knob_table):
    last = knob_table[-1]
    cfg = {k["name"]: k["default"] for k in knob_table[:-1]}
    assert A.knob_value(cfg, last["name"]) == A.knob_value({last["name"]: last["default"]},
                                                           last["name"])


def test_the_peer_gets_every_axis_resolved(memtrade_bin, knob_table):
    import memtrade_side

    listed = memtrade_side.list_points(memtrade_bin, ["--model", "gpt-mini", "--checkpoint", "0.5",
                                                      "--optimizer", "sgd-momentum"])
    (p,) = listed["points"]
    assert {k["name"] for k in knob_table} <= set(p["config"])
    assert p["config"]["hyper"]["family"] == "gpt"
    assert p["resolved"]["optimizer_hyper"]["kind"] == "sgd-momentum"
    assert p["resolved"]["lr"] == p["resolved"]["optimizer_hyper"]["lr"] > 0
    assert [s[2] for s in p["resolved"]["checkpoint_plan"]["segments"]] == [False, True, False, True]
    # The flags of a config re-list the same point.
    again = memtrade_side.list_points(memtrade_bin, memtrade_side.flags_of(p["config"], knob_table))
    assert again["points"][0]["id"] == p["id"]


def test_no_knob_list_default_or_id_parser_outside_the_table():
    """reports/ and bench/peers/ learn the axes from memtrade; none keeps its own list of axes,
    defaults or an id parser (the strings below are what such copies looked like)."""
    table = json.loads(subprocess.run([str(pathlib.Path(__import__("os").environ.get(
        "MEMTRADE_BIN", ROOT / "build" / "memtrade"))), "knobs", "--json"], check=True,
        capture_output=True, text=True).stdout)
    settings = [k["name"] for k in table if not k["workload"]]
    for path in list((ROOT / "reports").glob("*.py")) + list((ROOT / "bench" / "peers").glob("*.py")):
        text = path.read_text()
        assert "parse_id" not in text, path
        assert "def checkpoint_plan(ck" not in text, path
        # A literal list of three or more axis names in a row is a copy of the table.
        quoted = [f'"{n}"' for n in settings]
        for i in range(len(quoted) - 2):
            run = ", ".join(quoted[i:i + 3])
            assert run not in text, (path, run)


def test_design_doc_knob_table_is_generated(memtrade_bin):
    """docs/design.md's knob table is `memtrade knobs --markdown`, not a copy kept by hand."""
    r = subprocess.run([sys.executable, str(ROOT / "ci" / "knob_table_doc.py"), memtrade_bin,
                        str(ROOT / "docs" / "design.md"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_axes_that_do_not_apply_are_written_at_their_default(memtrade_bin):
    """memtrade writes an axis that does not apply to a point (the autocast policy of an O2
    precision, the attention kind of an MLP) at its default, so no reader needs to know which
    axis applies where: two such points are one configuration with one config."""
    import memtrade_side

    listed = memtrade_side.list_points(memtrade_bin, ["--model", "mlp-tiny", "--precision",
                                                      "bf16-o2", "--autocast-policy", "torch-cpu",
                                                      "--attention", "flash"])
    cfg = listed["points"][0]["config"]
    assert cfg["autocast_policy"] == "torch-cuda" and cfg["attention"] == "math"
    assert "ac-" not in listed["points"][0]["id"] and "attn-" not in listed["points"][0]["id"]
