"""Property-based fuzzing of the memtrade binary (issue 31): Hypothesis generates Hugging Face
config.json files, grid files and flag values, and every case must keep the command-line contract
of docs/design.md ("Exit codes"):

- the exit code is 0, 1, 2 or 3, never a signal or an abort ("terminate called");
- exit 2 (bad input) and 3 (out of memory) print exactly one line on stderr, "memtrade: ...";
- no case runs past its bound (a hang);
- input the oracle knows is bad (a size that is not a positive integer, an unknown architecture,
  text that is not JSON) is exit 2, never accepted;
- a results file that a run wrote parses, and holds every point the grid lists, each once.

Deterministic (derandomize: the same cases on every run, so CI cannot flake on a new draw) and
bounded to about two minutes on 2 cores. MEMTRADE_FUZZ_SCALE multiplies the case counts (10 for a
long local run); MEMTRADE_FUZZ_SEED draws other cases; MEMTRADE_FUZZ_TABLE=FILE writes the table
of outcomes per category (clean, crash, hang, unclear message, bad input accepted or wrong exit,
data lost) that docs/design.md quotes.
"""
import json
import os
import pathlib
import resource
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis import seed as hypothesis_seed

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.path.abspath(os.environ.get("MEMTRADE_BIN", str(ROOT / "build" / "memtrade")))
FIXTURES = ROOT / "tests" / "models" / "fixtures" / "hf"
SCALE = float(os.environ.get("MEMTRADE_FUZZ_SCALE", "1"))
SEED = os.environ.get("MEMTRADE_FUZZ_SEED")
# Address space of every fuzzed process: a size that passes every bound and asks the host for
# more than this fails its allocation (an oom row, exit 3) instead of swapping a CI machine.
ADDRESS_SPACE = 6 << 30
OUTCOMES = {}  # category -> {outcome: count}, for MEMTRADE_FUZZ_TABLE
TABLE_MODE = bool(os.environ.get("MEMTRADE_FUZZ_TABLE"))  # count every outcome, fail none


def cases(n):
    kw = dict(max_examples=max(1, int(n * SCALE)), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True,
              derandomize=SEED is None)

    def decorate(test):
        test = settings(**kw)(test)
        return test if SEED is None else hypothesis_seed(int(SEED))(test)
    return decorate


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


# Data-parallel points start ranks; generated rank counts (7, 64) are refused by the fuzzer's
# launcher rather than started on CI's 2 cores (tests/fuzz/launch_ranks.sh).
os.environ.setdefault(
    "MEMTRADE_LAUNCHER", f"bash {pathlib.Path(__file__).resolve().parent / 'launch_ranks.sh'} {{n}}")


class Case:
    """One run of the binary and the verdict on it (the first broken rule, or "clean")."""

    def __init__(self, category, args, timeout, bad=False, cwd=None, given=""):
        self.category, self.args, self.bad, self.given = category, args, bad, given
        try:
            p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout, cwd=cwd,
                               preexec_fn=_limit, env=dict(os.environ, OMP_NUM_THREADS="1"))
            self.rc, self.out, self.err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            self.rc, self.out, self.err = None, b"", b""
        self.outcome, self.why = self._judge()

    def _judge(self):
        if self.rc is None:
            return "hang", "no exit within the bound"
        err = self.err.decode("utf-8", "replace")
        if self.rc < 0 or self.rc in (134, 136, 139) or "terminate called" in err:
            return "crash", f"exit {self.rc}: {err[-300:]!r}"
        if self.rc not in (0, 1, 2, 3):
            return "wrong exit", f"exit {self.rc}"
        if self.rc in (2, 3):
            if err.count("\n") != 1 or not err.endswith("\n") or not err.startswith("memtrade: "):
                return "unclear", f"exit {self.rc} with stderr {err[:300]!r}"
            if len(err) > 2048:
                return "unclear", f"a {len(err)}-byte line"
        if self.bad and self.rc != 2:
            return "bad accepted", f"exit {self.rc} for bad input: {err[:200]!r}"
        return "clean", ""

    def settle_results(self, path, expected_ids):
        """settle(), with a results file the run left judged as well (results_problem)."""
        problem = results_problem(path, expected_ids)
        if problem:
            self.settle("data lost", problem)
        else:
            self.settle()

    def settle(self, outcome=None, why=""):
        if outcome is not None and self.outcome == "clean":
            self.outcome, self.why = outcome, why
        table = OUTCOMES.setdefault(self.category, {})
        table[self.outcome] = table.get(self.outcome, 0) + 1
        if TABLE_MODE and self.outcome != "clean":
            print(f"\n{self.category}: {self.outcome}: {self.why}\nargs: {self.args!r}\n"
                  f"input: {self.given[:2000]!r}")
        assert TABLE_MODE or self.outcome == "clean", (
            f"{self.outcome}: {self.why}\nargs: {self.args!r}\ninput: {self.given[:2000]!r}")


def results_problem(path, expected_ids):
    """Why a results file a run left is not whole (None when it is)."""
    try:
        doc = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        return f"results file unreadable: {e}"
    ids = [p.get("id") for p in doc.get("points", [])]
    if len(ids) != len(set(ids)):
        return "a point twice"
    bad = [p for p in doc["points"] if p.get("status") not in
           ("ok", "oom", "error", "timeout", "skipped")]
    if bad:
        return f"a row with status {bad[0].get('status')!r}"
    if expected_ids is not None and sorted(ids) != sorted(expected_ids):
        return f"{len(ids)} points for the {len(expected_ids)} listed"
    return None


# ---- values -------------------------------------------------------------------------------------

INTS = [0, -1, 1, 2, 3, 7, 64, 100000, 2**31 - 1, 2**31, 2**32 + 1, 2**53 + 1, 2**63 - 1, -2**63,
        2**64, 10**30]
FLOATS = [0.0, 0.5, -1.5, 1e-300, 1e30, 1e308, 2.0, 3.7]
STRINGS = ["", "x", "a\nb", "\t", "\u00e9", "1e400", "nan", "-1", "64", "../../etc", "x" * 5000]
weird = st.one_of(
    st.sampled_from(INTS), st.integers(), st.sampled_from(FLOATS),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(STRINGS), st.text(max_size=20),
    st.none(), st.booleans(), st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["a", "type", "factor"]), st.integers(-2, 9), max_size=2),
    st.integers(1, 200).map(lambda d: {"deep": d}))  # nested d levels (written as text below)


def dump_value(v):
    if isinstance(v, dict) and set(v) == {"deep"}:
        return "[" * v["deep"] + "]" * v["deep"]
    return json.dumps(v)


def dump_config(cfg):
    return "{" + ", ".join(f"{json.dumps(k)}: {dump_value(v)}" for k, v in cfg.items()) + "}"


# ---- config.json --------------------------------------------------------------------------------

# The sizes every architecture reads, with no default: a value that is not a positive integer (a
# string, a fraction, null, zero, negative, nesting) must be refused.
SIZES = {"LlamaForCausalLM": ["hidden_size", "num_hidden_layers", "num_attention_heads",
                              "intermediate_size", "vocab_size"],
         "GPT2LMHeadModel": ["n_embd", "n_layer", "n_head", "vocab_size"]}
# The architectures memtrade reads (models/config/hf_config.h); the Llama-like ones (the
# mixture-of-experts Mixtral and Qwen2-MoE and Gemma 2 included) take Llama's size keys.
READ = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
        "Phi3ForCausalLM", "Gemma2ForCausalLM", "GPT2LMHeadModel", "MixtralForCausalLM",
        "Qwen2MoeForCausalLM"]
TINY = {"LlamaForCausalLM": dict(architectures=["LlamaForCausalLM"], hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=64, vocab_size=128,
                                 max_position_embeddings=32, rope_theta=10000.0,
                                 tie_word_embeddings=False),
        "GPT2LMHeadModel": dict(architectures=["GPT2LMHeadModel"], n_embd=32, n_layer=2, n_head=4,
                                vocab_size=128, n_positions=32, activation_function="gelu_new")}


def never_a_size(v):
    if isinstance(v, bool) or v is None or isinstance(v, (str, list)):
        return True
    if isinstance(v, dict):
        return True
    if isinstance(v, float):
        return not v.is_integer() or v <= 0
    return isinstance(v, int) and v <= 0


@st.composite
def config_case(draw):
    bases = sorted(FIXTURES.glob("*.json"))
    base = draw(st.sampled_from(["tiny-llama", "tiny-gpt2"] + [b.stem for b in bases]))
    if base.startswith("tiny-"):
        cfg = dict(TINY["LlamaForCausalLM" if base == "tiny-llama" else "GPT2LMHeadModel"])
    else:
        cfg = json.loads((FIXTURES / f"{base}.json").read_text())
    arch = cfg["architectures"][0]
    bad = False
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "set", "size", "delete", "add", "arch"]))
        if op == "set":
            cfg[draw(st.sampled_from(sorted(cfg)))] = draw(weird)
        elif op == "size":
            key = draw(st.sampled_from(SIZES.get(arch, SIZES["LlamaForCausalLM"])))
            v = draw(weird)
            cfg[key] = v
        elif op == "delete" and len(cfg) > 1:
            del cfg[draw(st.sampled_from(sorted(cfg)))]
        elif op == "add":
            cfg[draw(st.sampled_from(["rope_scaling", "unknown_key", "sliding_window", "head_dim",
                                      "num_key_value_heads", "torch_dtype"]))] = draw(weird)
        elif op == "arch":
            cfg["architectures"] = draw(st.sampled_from(
                [["Foo"], [], "LlamaForCausalLM", ["MistralForCausalLM"], ["GPT2LMHeadModel"],
                 ["LlamaForCausalLM", "GPT2LMHeadModel"], None]))
    arch_now = cfg.get("architectures")
    if not (isinstance(arch_now, list) and len(arch_now) == 1 and arch_now[0] in READ):
        bad = True  # missing, unknown or ambiguous architecture
    else:
        sizes = SIZES.get(arch_now[0], SIZES["LlamaForCausalLM"])
        if any(k in cfg and never_a_size(cfg[k]) for k in sizes):
            bad = True
    text = dump_config(cfg)
    raw = draw(st.sampled_from(["none"] * 6 + ["truncate", "garbage", "overflow"]))
    if raw == "truncate":
        text, bad = text[:draw(st.integers(0, max(0, len(text) - 2)))], True
    elif raw == "garbage":
        text, bad = text + draw(st.sampled_from(["}", ",", "x", "\x00"])), True
    elif raw == "overflow":  # 1e400 under a key nobody reads: not JSON memtrade reads
        text, bad = text.replace("{", '{"ignored": 1e400, ', 1), True
    if any(isinstance(v, dict) and set(v) == {"deep"} and v["deep"] >= 64 for v in cfg.values()):
        bad = True  # deeper than memtrade reads
    return base, text, bad


@cases(220)
@given(config_case(), st.sampled_from(["estimate", "estimate", "list", "run"]))
def test_config_files(case, command):
    base, text, bad = case
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "config.json"
        path.write_text(text)
        if command == "estimate":
            c = Case("config.json", ["estimate", "--model-config", str(path)], 30, bad, given=text)
        elif command == "list":
            c = Case("config.json", ["run", "--model-config", str(path), "--list", "--json"], 30,
                     bad, given=text)
        else:
            out = pathlib.Path(d) / "r.json"
            c = Case("config.json",
                     ["run", "--backend", "cpu", "--model-config", str(path), "--seq-len", "8",
                      "--batch-size", "1", "--steps", "1", "--warmup", "0", "--capacity",
                      "256MiB", "--timeout", "30s", "--quiet", "--out", str(out)], 90, bad,
                     given=text)
            if c.rc in (0, 1):
                c.settle_results(out, None)
                return
        c.settle()


# ---- grid files ---------------------------------------------------------------------------------

def knob_table():
    return json.loads(subprocess.run([BIN, "knobs", "--json"], check=True,
                                     capture_output=True).stdout)


KNOBS = knob_table()
CHOICES = {k["name"]: k.get("choices") or k.get("examples") or [k["default"]] for k in KNOBS}
CHOICES["model"] = ["mlp-tiny", "gpt-tiny", "llama-tiny", "cnn-tiny", "gpt-tiny:n_layer=1"]
CHOICES["batch_size"] = [1, 2, 4, 4096]
CHOICES["seq_len"] = [0, 8, 16]
CHOICES["checkpoint"] = [0, 1, 0.5, "sqrt", "selective", "first0.5"]
CHOICES["model_config"] = [""]


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if not isinstance(v, float) or abs(v) < 1e300 else "1e300"
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string is JSON's escapes
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    return '""'


toml_weird = st.one_of(st.sampled_from(INTS), st.sampled_from(FLOATS), st.sampled_from(STRINGS),
                       st.booleans(), st.lists(st.integers(-2, 5), max_size=2),
                       st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=1))


@st.composite
def grid_case(draw):
    lines = []
    if draw(st.booleans()):
        lines.append(f"name = {toml_value(draw(st.one_of(st.sampled_from(['fz', 'a.b', 'x y', '../e', '.h', '']), toml_weird)))}")
    if draw(st.booleans()):
        lines.append(f"mode = {toml_value(draw(st.sampled_from(['cartesian', 'sweep', 'zip', 3])))}")
    run = {"backend": "cpu"}
    for key in draw(st.lists(st.sampled_from(["warmup", "steps", "seed", "capacity", "timeout",
                                              "backend", "bogus"]), max_size=3, unique=True)):
        run[key] = draw(st.one_of(st.sampled_from([0, 1, 2, "64MiB", "1s", "5m", "cpu"]),
                                  toml_weird))
    lines.append("[run]")
    lines += [f"{k} = {toml_value(v)}" for k, v in run.items()]
    lines.append("[axes]")
    names = draw(st.lists(st.sampled_from(sorted(CHOICES) + ["bogus_axis"]), min_size=1,
                          max_size=3, unique=True))
    if "model" not in names:
        names.append("model")
    for name in names:
        pool = CHOICES.get(name, ["x"])
        values = draw(st.lists(st.one_of(st.sampled_from(pool), st.sampled_from(pool), toml_weird),
                               min_size=0, max_size=3))
        lines.append(f"{name} = {toml_value(values)}")
    if draw(st.integers(0, 4)) == 0:
        lines.append("[[exclude]]")
        lines.append(f"{draw(st.sampled_from(names + ['nope']))} = {toml_value(draw(toml_weird))}")
    text = "\n".join(lines) + "\n"
    raw = draw(st.sampled_from(["none"] * 8 + ["truncate", "dup"]))
    if raw == "truncate":
        text = text[:draw(st.integers(0, len(text)))]
    elif raw == "dup":
        text += "[axes]\n"
    return text


@cases(110)
@given(grid_case())
def test_grid_files(text):
    with tempfile.TemporaryDirectory() as d:
        grid = pathlib.Path(d) / "g.toml"
        grid.write_text(text)
        listed = Case("grid TOML", ["run", "--grid", str(grid), "--list"], 30, given=text)
        if listed.rc != 0 or listed.outcome != "clean":
            listed.settle()
            return
        ids = listed.out.decode().split()
        if not 1 <= len(ids) <= 3:
            listed.settle()
            return
        out = pathlib.Path(d) / "r.json"
        c = Case("grid TOML", ["run", "--grid", str(grid), "--steps", "1", "--warmup", "0",
                               "--timeout", "20s", "--capacity", "256MiB", "--quiet", "--out",
                               str(out)], 30 + 25 * len(ids), cwd=d, given=text)
        if c.rc in (0, 1) and c.outcome == "clean":
            c.settle_results(out, ids)
            return
        c.settle("wrong exit", "the grid listed but did not run") if c.rc == 2 else c.settle()


# ---- flags --------------------------------------------------------------------------------------

FLAG_VALUES = ["", "0", "1", "-1", "2", "8", "1.5", "nan", "inf", "-inf", "1e400", "1e39",
               "2147483648", "4294967297", "18446744073709551616", "abc", "5s extra", "a\nb",
               "x" * 3000, "64MiB", "0B", "1TiB", "a10g", "h200", "60s", "0s", "1/2", "3/2", "0/0",
               "fp16", "sqrt", "first0.5", "flash", "zero", "eval", "per_step", "pageable",
               "gpt-tiny:n_layer=1", "gpt-tiny:n_layer=0", "llama-tiny:n_kv_head=3", "mlp-tiny",
               "gpt-tiny", "cnn-tiny", "llama-tiny", "gpt-tiny:bogus=1", "gpt-tiny:", ":", "-",
               "--", "--steps"]
POINT_FLAGS = [k["flag"] for k in KNOBS if k["name"] != "model_config"] + [
    "--seed", "--lr", "--backend", "--capacity", "--threads"]
RUN_FLAGS = POINT_FLAGS + ["--warmup", "--steps", "--timeout", "--select", "--shard",
                          "--trace-snapshot"]


@st.composite
def flag_case(draw):
    command = draw(st.sampled_from(["run", "run", "step", "estimate", "fit", "advise", "export",
                                    "compare", "merge", "trace", "history", "knobs", "devices",
                                    "bogus"]))
    pool = {"run": RUN_FLAGS, "step": POINT_FLAGS, "estimate": POINT_FLAGS,
            "fit": POINT_FLAGS + ["--max-batch"], "advise": ["--capacity", "--model", "--budget",
                                                              "--gpu", "--batch-size", "--json"],
            "export": ["-o"], "compare": ["--thresholds", "--format", "--rename", "--allow-env-change",
                                    "--allow-unstable", "--max-extra-rounds"],
            "merge": ["-o", "--grid"], "trace": ["--format", "-o", "--at"],
            "history": ["--db", "--metric", "--series", "--recent", "--max-p", "--min-effect",
                        "--min-runs", "--json"],
            "knobs": ["--json", "--markdown"], "devices": [], "bogus": ["--x"]}[command]
    args = [command]
    if command == "history":
        args.append(draw(st.sampled_from(["add", "list", "trend", "baseline", "changes",
                                          "changes", "nope"])))
    for flag in draw(st.lists(st.sampled_from(pool or ["--help"]), max_size=4)):
        args += [flag, draw(st.one_of(st.sampled_from(FLAG_VALUES), st.text(max_size=12)))]
    if command in ("export", "compare", "merge", "trace"):
        args += draw(st.lists(st.sampled_from(["missing.json", "/", "/dev/null", "x.toml"]),
                              max_size=2))
    if command in ("run", "step", "estimate", "fit") and "--capacity" not in args:
        args += ["--capacity", "256MiB"]  # a huge point is a quick oom, not minutes of paging
    if command == "run":
        args += ["--steps", "1", "--warmup", "0", "--timeout", "20s"]
        if draw(st.booleans()):
            args.append("--list")
    return [a.replace("\x00", "") for a in args]


@cases(110)
@given(flag_case())
def test_flags(args):
    with tempfile.TemporaryDirectory() as d:
        if args[0] == "run" and "--list" not in args:
            args = args + ["--quiet", "--out", str(pathlib.Path(d) / "r.json")]
        c = Case("flags", args, 120, cwd=d)
        out = pathlib.Path(d) / "r.json"
        if args[0] == "run" and c.rc in (0, 1) and c.outcome == "clean" and out.exists():
            c.settle_results(out, None)
            return
        c.settle()


# ---- the table ----------------------------------------------------------------------------------

@pytest.fixture(scope="session", autouse=True)
def outcome_table():
    yield
    path = os.environ.get("MEMTRADE_FUZZ_TABLE")
    if not path:
        return
    cols = ["clean", "crash", "hang", "unclear", "bad accepted", "wrong exit", "data lost"]
    lines = ["| category | cases | " + " | ".join(cols) + " |",
             "|---|---:|" + "---:|" * len(cols)]
    for cat, counts in OUTCOMES.items():
        lines.append(f"| {cat} | {sum(counts.values())} | " +
                     " | ".join(str(counts.get(c, 0)) for c in cols) + " |")
    pathlib.Path(path).write_text("\n".join(lines) + "\n")
