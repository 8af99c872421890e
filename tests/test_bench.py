"""`eaglespec bench` end to end on tiny random models on the CPU (a Llama folder with a character tokenizer, and
--random-weights), the prompt loaders, the oracle's acceptance, the output files, and the bandwidth arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_cli import cpu_forward_cost
from tiny import tiny_llama

from eaglespec.bench.bandwidth import DecodeTraffic, kv_bytes_per_token, weight_bytes_per_step
from eaglespec.bench.datasets import MT_BENCH_FILE, PromptItem, encode, mt_bench, read_jsonl, second_turn
from eaglespec.bench.random_model import PRESETS, build_on_meta, random_drafter, random_model, shape_config
from eaglespec.cli import main
from eaglespec.config import ModelConfig
from eaglespec.errors import ConfigError
from eaglespec.loading.safetensors_io import save_safetensors
from eaglespec.models import get_model_class
from eaglespec.models.llama import LlamaForCausalLM

SPECIAL = ["<unk>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 (2 is EOS)
CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()-\n"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VOCAB = 97
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RECORD_KEYS = {
    "config": str, "kind": str, "batch_size": int, "prompts": int, "prompt_tokens": int, "output_tokens": int,
    "seconds": float, "tok_per_s": float, "identical_outputs": int, "identical_reference": str,
    "finished_by_eos": int, "time_split": dict, "batching": str, "engine_steps": dict, "auto": bool, "round": int,
    "spare_rows": int,
}
OPTIONAL_KEYS = ("drafter", "steps", "topk", "draft_tokens", "schedule", "shape", "speedup", "accept_length_mean",
                 "accept_length_hist", "accept_rate_per_depth", "verify_steps", "draft_forwards", "bandwidth")


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def write_tiny_chat_folder(folder: Path, max_pos: int = 1024) -> Path:
    """A tiny Llama (tests/tiny.py weights) with a character-level tokenizer and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models

    folder.mkdir(parents=True, exist_ok=True)
    tokens = SPECIAL + list(CHARS)
    tokens += [f"<x{i}>" for i in range(len(tokens), VOCAB)]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], unk_token="<unk>"))
    tk.add_special_tokens(SPECIAL)
    tk.decoder = decoders.Fuse()
    tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHATML}))
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=VOCAB, hidden_size=64,
               intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=max_pos, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0,
               bos_token_id=1, eos_token_id=2)
    (folder / "config.json").write_text(json.dumps(cfg))
    m = tiny_llama(max_position_embeddings=max_pos)
    save_safetensors({k: v.contiguous() for k, v in m.state_dict().items()}, folder / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    return write_tiny_chat_folder(tmp_path_factory.mktemp("bench") / "tiny")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    p.write_text("\n".join([
        json.dumps({"prompt": "What is the capital of France?"}),
        json.dumps({"turns": ["Tell me a story.", "Shorter, please."]}),
        "",
        json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "dropped"}]}),
    ]) + "\n")
    return p


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def check_schema(doc: dict) -> None:
    assert doc["schema"] == "eaglespec.bench" and doc["schema_version"] == 1
    for key in ("date", "command", "git_revision", "git_dirty", "machine", "model", "prompts", "sampling", "engine",
                "warmup", "batch_sizes", "batching", "repeats", "peer", "records", "summary", "complete"):
        assert key in doc, key
    assert len(doc["summary"]) == len({(r["config"], r["batch_size"]) for r in doc["records"]})
    assert sum(r["runs"] for r in doc["summary"]) == len(doc["records"])
    assert doc["command"].startswith("eaglespec ")
    assert set(doc["sampling"]) == {"max_new_tokens", "temperature", "top_p", "top_k", "ignore_eos", "seed", "min_p",
                                    "repetition_penalty", "frequency_penalty", "presence_penalty", "structured"}
    assert set(doc["engine"]) == {"cuda_graphs", "fuse_projections", "compile", "overlap", "spec_max_rows",
                                  "min_prefill_rows", "prefill_ahead", "compact_rows"}
    assert doc["machine"]["device"] == "cpu" and doc["machine"]["copy_bandwidth_gb_s"] is None
    assert isinstance(doc["model"]["weight_bytes_per_step"], int) and doc["model"]["kv_bytes_per_token"] > 0
    for r in doc["records"]:
        for key, typ in RECORD_KEYS.items():
            assert isinstance(r[key], typ) or (r["kind"] == "peer" and key == "time_split" and r[key] is None), \
                (key, r[key])
        for key in OPTIONAL_KEYS:
            assert key in r, key
        # seconds are rounded to 0.1 ms: for a run of a few ms that alone moves tok/s by about 1%
        assert r["output_tokens"] / r["tok_per_s"] == pytest.approx(  # tok/s is rounded to 0.01 in the document
                r["seconds"], rel=max(1e-3, 0.0051 / r["tok_per_s"]), abs=6e-5)
        ts = r["time_split"]
        if ts is not None:
            assert set(ts) == {"draft", "verify", "rest", "prefill", "decode", "commit"}
            assert ts["draft"] + ts["verify"] + ts["rest"] == pytest.approx(r["seconds"], abs=1e-3)
        if r["kind"] == "no-spec":
            assert r["speedup"] == 1.0 and r["identical_outputs"] == r["prompts"]
            assert r["accept_length_mean"] is None and ts["draft"] == 0.0 and ts["verify"] == 0.0
            assert set(r["bandwidth"]) == {"decode_steps", "decode_seconds", "decode_seconds_from", "bytes",
                                           "bytes_per_step", "achieved_gb_s", "device_gb_s", "fraction_of_device"}
        if r["kind"] == "spec" and not r["engine_steps"].get("spec"):  # --spec-max-rows left it none to speculate
            assert r["accept_length_mean"] is None and r["engine_steps"].get("decode")
        elif r["kind"] == "spec":
            assert isinstance(r["accept_length_mean"], float) and r["bandwidth"] is None
            assert sum(r["accept_length_hist"].values()) == r["verify_steps"] > 0
            if r["schedule"] is None:
                assert r["draft_forwards"] == r["steps"] * r["verify_steps"]
            else:  # each step drafts with its own shape's S
                steps = [e[1] for e in r["schedule"]]
                assert min(steps) * r["verify_steps"] <= r["draft_forwards"] <= max(steps) * r["verify_steps"]


def check_png(path: Path) -> None:
    import matplotlib.pyplot as plt

    assert path.read_bytes()[:8] == PNG_MAGIC
    img = plt.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_git_revision_from_the_tree_or_the_environment(monkeypatch):
    """A result names the commit it ran: git's, or `EAGLESPEC_GIT_REVISION` where the local `.git` is not the files'
    (a device machine's copy of the tree)."""
    from eaglespec.bench.report import git_revision

    monkeypatch.delenv("EAGLESPEC_GIT_REVISION", raising=False)
    rev, dirty = git_revision()
    assert rev is None or (len(rev) == 40 and dirty in (True, False, None))  # None: a copy of the tree without .git
    monkeypatch.setenv("EAGLESPEC_GIT_REVISION", "447195e-dirty")
    assert git_revision() == ("447195e", True)
    monkeypatch.setenv("EAGLESPEC_GIT_REVISION", "447195e")
    assert git_revision() == ("447195e", False)


# --- prompt sets ---------------------------------------------------------------------------------------------------
def test_mt_bench_is_shipped_and_complete():
    import eaglespec

    assert Path(eaglespec.__file__).parent in MT_BENCH_FILE.parents  # read from the package, not ../shared
    items = mt_bench()
    assert len(items) == 80 and all(isinstance(i.first, str) and i.follow_up for i in items)
    assert items[0].first.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    assert items[0].follow_up == "Rewrite your previous response. Start every sentence with the letter A."


def test_jsonl_forms_and_errors(prompt_file, tmp_path):
    items = read_jsonl(prompt_file)
    assert items[0] == PromptItem("What is the capital of France?")
    assert items[1] == PromptItem("Tell me a story.", "Shorter, please.")
    assert [m["role"] for m in items[2].first] == ["system", "user"]  # the trailing assistant turn is dropped
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"prompt_ids": [5, 6, 7]}\n')
    assert encode(None, read_jsonl(ids)[0].first) == ([5, 6, 7], None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"question": "no"}\n')
    with pytest.raises(ConfigError, match="bad.jsonl line 2 has none of 'prompt'"):
        read_jsonl(bad)
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(ConfigError, match="line 2 is not valid JSON"):
        read_jsonl(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_second_turn_follows_the_first_answer():
    conv = second_turn(PromptItem("Q1", "Q2"), "A1")
    assert conv == [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                    {"role": "user", "content": "Q2"}]


# --- bench end to end -----------------------------------------------------------------------------------------------
def test_bench_jsonl_oracle_and_random(chat_model, prompt_file, tmp_path, capsys):
    out = tmp_path / "out"
    max_new = 12
    code, stdout, err = run_cli(
        ["bench", "--model", chat_model, "--prompts", prompt_file, "--batch-sizes", "1,2", "--spec", "3,1,4",
         "--spec", "2,2,4", "--draft", "oracle", "--draft", "random", "--max-new-tokens", max_new, "--ignore-eos",
         "--warmup", "1", "--device", "cpu", "--out", out], capsys)
    assert code == 0, err
    doc = json.loads((out / "results.json").read_text())
    check_schema(doc)
    recs = doc["records"]
    names = ["no-spec", "oracle S3 K1 D4", "oracle S2 K2 D4", "random S3 K1 D4", "random S2 K2 D4"]
    assert [(r["config"], r["batch_size"]) for r in recs] == [(n, b) for b in (1, 2) for n in names]
    n = 3
    for r in recs:
        assert r["prompts"] == n and r["output_tokens"] == n * max_new
        assert r["identical_outputs"] == n  # greedy speculation == plain greedy, token for token (fp32)
        assert r["identical_reference"] == f"no-spec bs={1 if r['kind'] == 'no-spec' else r['batch_size']}"
    for r in recs:
        if r["drafter"] == "oracle":  # every draft on the reference path is accepted: tau reaches min(S, D-1) + 1
            top = min(r["steps"], r["draft_tokens"] - 1) + 1
            assert max(int(t) for t, c in r["accept_length_hist"].items() if c) == top
            assert r["accept_length_hist"][str(top)] >= r["verify_steps"] - n  # only a sequence's end may fall short
            assert r["accept_rate_per_depth"][0] == 1.0
        if r["drafter"] == "random":
            assert r["accept_length_mean"] < 1.5
    # bandwidth: 3 sequences of 12 tokens, 11 decode steps each at batch 1; at batch 2, 11 steps per static batch
    base1, base2 = recs[0], recs[5]
    assert base1["bandwidth"]["decode_steps"] == 3 * (max_new - 1)
    assert base2["bandwidth"]["decode_steps"] == 2 * (max_new - 1)
    prompt_lens = [row["prompt_tokens"] for row in map(json.loads, (out / "outputs.jsonl").read_text().splitlines())]
    m = max_new - 1
    kv_reads = sum(m * P + m * (m + 1) // 2 for P in prompt_lens)
    wb, kvb = doc["model"]["weight_bytes_per_step"], doc["model"]["kv_bytes_per_token"]
    assert base1["bandwidth"]["bytes"] == 3 * m * wb + kv_reads * kvb
    assert base1["bandwidth"]["achieved_gb_s"] > 0 and base1["bandwidth"]["device_gb_s"] is None
    assert base1["bandwidth"]["decode_seconds_from"] == "timer"  # the eager CPU path times every decode step
    # the Markdown table is printed last and written as results.md
    md = (out / "results.md").read_text()
    assert stdout == md
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| config | batch | tok/s | speedup |") and "| rest % | prefill % |" in table[0]
    assert all(line.count("|") == table[0].count("|") for line in table[: 2 + len(doc["records"])])
    for name in names:
        assert any(line.startswith(f"| {name} | 2 |") for line in table)
    assert "| oracle S3 K1 D4 | 1 | 1:0 2:0 3:0 4:" in md  # the acceptance histogram table
    check_png(out / "results.png")
    assert "oracle S3 K1 D4 bs=2" in err  # progress on stderr


def test_bench_mt_bench_two_turns_with_peer(chat_model, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(
        ["bench", "--model", chat_model, "--limit", "2", "--turns", "2", "--batch-sizes", "2", "--spec", "3,1,4",
         "--draft", "oracle", "--max-new-tokens", "6", "--warmup", "0", "--peer", "hf", "--device", "cpu",
         "--out", out], capsys)
    assert code == 0, err
    doc = json.loads((out / "results.json").read_text())
    check_schema(doc)
    assert doc["prompts"] == {"set": "mt-bench", "count": 4, "turns": 2, "prompt_tokens_mean": doc["prompts"][
        "prompt_tokens_mean"]}
    rows = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert [r["turn"] for r in rows] == [1, 1, 2, 2]
    questions = mt_bench()[:2]
    for first, second, q in zip(rows[:2], rows[2:], questions):
        assert first["answer"] and q.first in first["prompt"]
        # the second turn is asked after the model's own first answer
        assert f"{q.first}<|im_end|>\n<|im_start|>assistant\n{first['answer']}<|im_end|>" in second["prompt"]
        assert q.follow_up in second["prompt"] and second["prompt_tokens"] > first["prompt_tokens"]
    recs = {r["config"]: r for r in doc["records"]}
    assert set(recs) == {"no-spec", "oracle S3 K1 D4", "hf-transformers"}
    assert all(r["prompts"] == 4 for r in recs.values())
    assert recs["oracle S3 K1 D4"]["identical_outputs"] == 4
    peer = recs["hf-transformers"]
    assert peer["kind"] == "peer" and peer["batch_size"] == 1 and peer["time_split"] is None
    assert peer["identical_outputs"] == 4  # transformers' greedy generate agrees with ours in fp32
    assert peer["speedup"] is None  # no no-spec run at batch 1 to compare with
    assert doc["peer"]["library"] == "transformers" and doc["peer"]["version"]


def bench_tiny_random(tmp_path, capsys, spec: str, *more: str) -> tuple[Path, dict]:
    """`eaglespec bench` on a 2-layer Llama of random weights (its config.json written here), 3 random prompts of 10
    tokens, 5 new tokens, batch sizes 1 and 3, a random drafter with `--spec spec` (and `more` options); returns
    (config path, results)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "shape.json"
    cfg.write_text(json.dumps(dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=101,
                                   hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)))
    out = tmp_path / "out"
    code, _, err = run_cli(
        ["bench", "--random-weights", cfg, "--prompt-len", "10", "--limit", "3", "--batch-sizes", "1,3", "--spec",
         spec, "--draft", "random", "--max-new-tokens", "5", "--device", "cpu", "--out", out, *more], capsys)
    assert code == 0, err
    doc = json.loads((out / "results.json").read_text())
    check_schema(doc)
    assert doc["complete"] is True and "Incomplete" not in (out / "results.md").read_text()
    check_png(out / "results.png")
    return cfg, doc


def test_bench_random_weights(tmp_path, capsys):
    cfg, doc = bench_tiny_random(tmp_path, capsys, "2,1,3")
    assert doc["prompts"]["set"] == "random" and doc["prompts"]["prompt_tokens_mean"] == 10
    assert doc["sampling"]["ignore_eos"] is True and doc["model"]["source"] == f"random-weights:{cfg}"
    # tied head: embedding read whole once; per layer q,o 32x32, k,v 32x16, MLP 3x32x64, two norms; final norm
    per_layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32
    assert doc["model"]["weight_bytes_per_step"] == 4 * (2 * per_layer + 32 + 101 * 32)
    assert doc["model"]["kv_bytes_per_token"] == 2 * 2 * 2 * 8 * 4
    assert [(r["config"], r["batch_size"], r["output_tokens"]) for r in doc["records"]] == [
        ("no-spec", 1, 15), ("random S2 K1 D3", 1, 15), ("no-spec", 3, 15), ("random S2 K1 D3", 3, 15)]
    assert doc["records"][2]["bandwidth"]["decode_steps"] == 4


def test_bench_with_penalties(tmp_path, capsys):
    """The logit adjustments reach the runs (answers equal to plain decoding's under them: `identical`) and the
    results name them."""
    _, doc = bench_tiny_random(tmp_path, capsys, "2,1,3", "--repetition-penalty", "1.3", "--frequency-penalty", "0.5")
    assert doc["sampling"]["repetition_penalty"] == 1.3 and doc["sampling"]["frequency_penalty"] == 0.5
    assert "repetition penalty 1.3, frequency penalty 0.5" in (tmp_path / "out" / "results.md").read_text()
    assert "--repetition-penalty 1.3" in doc["command"]
    assert all(r["identical_outputs"] in (None, r["prompts"]) for r in doc["records"]), doc["records"]


def test_bench_stopped_part_way_leaves_what_it_measured(tmp_path, capsys, monkeypatch):
    """A bench that dies in a later run (here the speculative run at batch size 3; on the GPU a timeout or a crash)
    has written every earlier record to --out, marked incomplete, with the prompts' answers and no plot; the same
    folder's complete run then says it is complete (bench_tiny_random checks)."""
    from eaglespec.bench.runs import ConfigRun

    real_run = ConfigRun.run

    def dying_run(self, *a, **kw):
        if self.config.speculative and self.batch_size == 3:
            raise RuntimeError("killed")
        return real_run(self, *a, **kw)

    monkeypatch.setattr(ConfigRun, "run", dying_run)
    with pytest.raises(RuntimeError, match="killed"):
        bench_tiny_random(tmp_path, capsys, "2,1,3")
    out = tmp_path / "out"
    doc = json.loads((out / "results.json").read_text())
    check_schema(doc)
    assert doc["complete"] is False
    assert [(r["config"], r["batch_size"]) for r in doc["records"]] == [
        ("no-spec", 1), ("random S2 K1 D3", 1), ("no-spec", 3)]
    assert doc["records"][1]["identical_outputs"] == 3 and doc["records"][1]["accept_length_mean"] >= 1.0
    assert "Incomplete: written after 3 record(s)" in (out / "results.md").read_text()
    assert not (out / "results.png").exists()
    rows = [json.loads(x) for x in (out / "outputs.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(isinstance(r["answer"], str) for r in rows)
    monkeypatch.setattr(ConfigRun, "run", real_run)
    bench_tiny_random(tmp_path, capsys, "2,1,3")  # complete now, its plot written


def test_bench_repeats_alternate_and_report_medians(tmp_path, capsys):
    """`--repeats 3`: per batch size the baseline and the configuration run three times, the second round in reverse
    order (ABBA); each speedup is against its own round's baseline; the summary holds the medians (tok/s and the
    per-round speedups) with their ranges, the table prints them, and every round's answers equal plain decoding."""
    cfg, doc = bench_tiny_random(tmp_path, capsys, "2,1,3", "--repeats", "3")
    out = tmp_path / "out"
    assert doc["repeats"] == 3
    plain, spec = "no-spec", "random S2 K1 D3"
    order = [(c, b, rnd) for b in (1, 3) for c, rnd in
             ((plain, 0), (spec, 0), (spec, 1), (plain, 1), (plain, 2), (spec, 2))]
    assert [(r["config"], r["batch_size"], r["round"]) for r in doc["records"]] == order
    for r in doc["records"]:
        base = next(x for x in doc["records"] if x["kind"] == "no-spec" and x["batch_size"] == r["batch_size"]
                    and x["round"] == r["round"])
        assert r["speedup"] == pytest.approx(r["tok_per_s"] / base["tok_per_s"], rel=1e-3)
        assert r["identical_outputs"] == r["prompts"] == 3
    assert [(s["config"], s["batch_size"], s["runs"]) for s in doc["summary"]] == [
        (plain, 1, 3), (spec, 1, 3), (plain, 3, 3), (spec, 3, 3)]
    for s in doc["summary"]:
        rs = [r for r in doc["records"] if (r["config"], r["batch_size"]) == (s["config"], s["batch_size"])]
        assert s["tok_per_s"] == pytest.approx(sorted(r["tok_per_s"] for r in rs)[1], abs=0.01)
        assert s["speedup"] == pytest.approx(sorted(r["speedup"] for r in rs)[1], abs=1e-4)
        assert s["tok_per_s_range"] == [min(r["tok_per_s"] for r in rs), max(r["tok_per_s"] for r in rs)]
    md = (out / "results.md").read_text()
    assert "Medians over 3 rounds" in md and f"| {spec} (round 1) | 3 |" in md
    assert any(line.startswith(f"| {spec} | 3 | 3 | ") for line in md.splitlines())
    code, _, err = run_cli(["bench", "--random-weights", cfg, "--device", "cpu", "--repeats", "0"], capsys)
    assert code == 2 and "--repeats must be >= 1 (got 0)" in err


def test_bench_runs_a_schedule(tmp_path, capsys):
    """`--spec R:S,K,D/...` benches a SpecSchedule as one configuration: a step over rows 0..R-1 takes the shape of the
    first entry whose limit reaches R (here the chain at 1 row, the tree at 2-3), answers equal plain decoding."""
    _, doc = bench_tiny_random(tmp_path, capsys, "1:2,1,3/3:2,2,4")
    name = "random 1:S2 K1 D3 / 3:S2 K2 D4"
    spec = [r for r in doc["records"] if r["kind"] == "spec"]
    assert [(r["config"], r["batch_size"]) for r in spec] == [(name, 1), (name, 3)]
    for r in spec:
        assert r["schedule"] == [[1, 2, 1, 3], [3, 2, 2, 4]] and r["steps"] is None and r["draft_tokens"] is None
        assert r["identical_outputs"] == r["prompts"] == 3
    assert all(r["schedule"] is None for r in doc["records"] if r["kind"] == "no-spec")


def test_bench_defaults_measure_what_generate_runs(tmp_path, capsys, monkeypatch):
    """`eaglespec bench` on the embedded model without --draft/--spec benches `--spec auto`: at each batch size the
    shape `draft="auto"` gives an engine of that many rows here (one row on an x86-64 CPU: the 4-bit path, as
    `generate`, there the chain of 3; with 2 rows, or --cpu-weights dense, float32 and the tree S3 K2 D6 at one row;
    answers identical either way; engines of several rows decode plainly, so nothing speculative runs at 2 rows and
    the log says why). The run keeps one name; its records carry the shape taken, the document the weights' path."""
    import platform

    from eaglespec.engine.int4_weights import INT4_DEFAULT_MACHINES

    four_bit = platform.machine().lower() in INT4_DEFAULT_MACHINES
    asked = cpu_forward_cost(monkeypatch, 1.0)  # this machine's forward timing (api.auto_spec) fixed
    name = "draft:smollm2-135m-eagle3 auto"
    for sizes in ("1", "1,2"):
        out = tmp_path / sizes
        code, stdout, err = run_cli(["bench", "--limit", "2", "--max-new-tokens", "8", "--batch-sizes", sizes,
                                     "--device", "cpu", "--out", out], capsys)
        assert code == 0, err
        doc = json.loads((out / "results.json").read_text())
        check_schema(doc)
        q4 = four_bit and sizes == "1"
        assert doc["model"]["int4_weights"] == q4 and doc["model"]["dtype"] == ("bfloat16" if q4 else "float32")
        assert [(r["config"], r["batch_size"]) for r in doc["records"]] == [("no-spec", 1), (name, 1),
                                                                            ("no-spec", 2)][:len(sizes.split(",")) + 1]
        auto = doc["records"][1]
        shape = (3, 1, 4) if q4 else (3, 2, 6)
        assert auto["auto"] and auto["shape"] == "S{} K{} D{}".format(*shape)
        assert (auto["steps"], auto["topk"], auto["draft_tokens"]) == shape
        # greedy's sizes, once
        assert auto["identical_outputs"] == auto["prompts"] == 2 and asked.pop() == ([2, 3, 4] if q4 else [3, 4, 6])
        assert not doc["records"][0]["auto"] and doc["records"][0]["shape"] is None
        assert "| {} = S{} K{} D{} | 1 |".format(name, *shape) in stdout  # the table names the shape taken
    assert f"{name} bs=2: not run, the default decodes plainly here (engines of several rows measured no faster" in err
    # the shipped drafter named, the embedded model by its GGUF's path: the same default
    from eaglespec.assets import default_drafter_path
    from eaglespec.loading.default import default_model_path

    code, stdout, err = run_cli(["bench", "--model", str(default_model_path()), "--draft", str(default_drafter_path()),
                                 "--limit", "2", "--max-new-tokens", "8", "--batch-sizes", "1", "--device", "cpu",
                                 "--out", tmp_path / "named"], capsys)
    assert code == 0, err
    named = json.loads((tmp_path / "named" / "results.json").read_text())["records"][1]
    assert named["config"] == name and named["auto"] and named["shape"] == ("S3 K1 D4" if four_bit else "S3 K2 D6")


def test_bench_with_a_structured_output(tmp_path, capsys):
    """`--json-object` reaches the runs (speculation's answers equal plain constrained decoding's: `identical`) and
    the results name it."""
    from eaglespec.assets import default_drafter_path

    code, _, err = run_cli(["bench", "--draft", str(default_drafter_path()), "--spec", "3,1,4", "--limit", "2",
                            "--max-new-tokens", "24", "--batch-sizes", "2", "--device", "cpu", "--json-object",
                            "--out", tmp_path / "out"], capsys)
    assert code == 0, err
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["sampling"]["structured"] == "json_object"
    assert "structured output json_object" in (tmp_path / "out" / "results.md").read_text()
    spec = [r for r in doc["records"] if r["config"] != "no-spec"]
    assert spec and all(r["identical_outputs"] == r["prompts"] for r in spec), spec


def test_bench_auto_follows_the_policy_per_batch_size(tmp_path, capsys, monkeypatch):
    """`--spec auto` with another drafter takes the policy's shape per batch size: a schedule where the policy names
    several shapes up to that size (here a chain at one row and a tree at 2-3 rows), one shape where it names one;
    and where this CPU's forwards make speculation slower (timed at load), it is not run, with the measurement."""
    import eaglespec.assets as assets
    from eaglespec.config import SpecConfig

    monkeypatch.setitem(assets._DEFAULT_SPEC, "cpu", ((1, SpecConfig(2, 1, 3)), (3, SpecConfig(2, 2, 4))))
    cpu_forward_cost(monkeypatch, 1.0)
    _, doc = bench_tiny_random(tmp_path, capsys, "auto")
    spec = [r for r in doc["records"] if r["kind"] == "spec"]
    assert [(r["config"], r["batch_size"], r["shape"]) for r in spec] == [
        ("random auto", 1, "S2 K1 D3"), ("random auto", 3, "1:S2 K1 D3 / 3:S2 K2 D4")]
    assert spec[0]["steps"] == 2 and spec[1]["schedule"] == [[1, 2, 1, 3], [3, 2, 2, 4]]
    assert all(r["auto"] and r["identical_outputs"] == r["prompts"] == 3 for r in spec)
    # with --spec-max-rows 1 no speculative step runs 3 rows: the one-row shape at both sizes, as api.load picks it
    _, doc = bench_tiny_random(tmp_path / "capped", capsys, "auto", "--spec-max-rows", "1")
    spec = [r for r in doc["records"] if r["kind"] == "spec"]
    assert [(r["batch_size"], r["shape"]) for r in spec] == [(1, "S2 K1 D3"), (3, "S2 K1 D3")]
    assert all(r["identical_outputs"] == r["prompts"] == 3 for r in spec)
    assert spec[0]["engine_steps"].get("spec") and not spec[1]["engine_steps"].get("spec")  # 3 rows: plain steps
    cpu_forward_cost(monkeypatch, 1.8)
    _, doc = bench_tiny_random(tmp_path / "slow", capsys, "auto")
    assert [r["kind"] for r in doc["records"]] == ["no-spec", "no-spec"]


# --- user errors ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["--spec", "3,2,9"], "between 1 and 1 + steps*topk = 7"),
    (["--spec", "3,2"], "--spec takes S,K,D"),
    (["--spec", "1:3,1,4/x:4,2,8"], "a schedule ROWS:S,K,D/ROWS:S,K,D/..."),
    (["--spec", "1:2:3,1,4"], "a schedule ROWS:S,K,D/ROWS:S,K,D/..."),
    (["--spec", "8:3,1,4/1:4,2,8"], "row limits >= 1 in increasing order"),
    (["--spec", "1:3,2,9"], "between 1 and 1 + steps*topk = 7"),
    (["--spec", "3,x,4"], "--spec must be comma-separated integers"),
    (["--batch-sizes", "1,x"], "--batch-sizes must be comma-separated integers"),
    (["--draft", "/no/such/drafter"], "neither 'oracle', 'random' nor an existing drafter folder"),
    (["--spec", "3,1,4"], "no drafter for this model"),
    (["--random-weights", "llama-3.1-8b"], "--model and --random-weights exclude"),
    (["--random-weights", "/no/such.json", "NO_MODEL"], "neither a preset"),
    (["--random-weights", "smollm2-135m", "--prompts", "mt-bench", "NO_MODEL"], "its prompts are random ids"),
    (["--prompts", "/no/prompts.jsonl"], "prompt file /no/prompts.jsonl does not exist"),
    (["--temperature", "0.7", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--presence-penalty", "-2.5"], "presence_penalty must be between -2 and 2 (got -2.5)"),
    (["--spec-max-rows", "0"], "spec_max_rows must be >= 1"),
    (["--random-weights", "smollm2-135m", "--json-object", "NO_MODEL"],
     "a structured output needs the model's tokenizer: not with --random-weights"),
    (["--json-object", "--peer", "hf"], "the peer (--peer hf) does not take a structured output"),
    (["--min-prefill-rows", "0"], "min_prefill_rows must be >= 1"),
    (["--prefill-ahead", "-1"], "prefill_ahead must be >= 0"),
    (["--draft", "oracle", "--spec", "3,1,4", "--batching", "continuous"], "--draft oracle needs --batching static"),
])
def test_bench_user_errors(chat_model, args, needle, capsys):
    model = [] if "NO_MODEL" in args else ["--model", chat_model]
    args = [a for a in args if a != "NO_MODEL"]
    code, _, err = run_cli(["bench", *model, "--device", "cpu", *args], capsys)
    lines = [line for line in err.strip().splitlines() if line.startswith("eaglespec: error: ")]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err


# --- random weights and bandwidth arithmetic ------------------------------------------------------------------------
def test_bandwidth_arithmetic_tiny_llama():
    m = tiny_llama()  # vocab 97, hidden 64, 6 layers, 4 heads (head_dim 16), 2 KV heads, MLP 128, untied, fp32
    per_layer = 64 * 64 + 2 * (64 * 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert weight_bytes_per_step(m) == 4 * (6 * per_layer + 64 + 97 * 64)  # the input embedding is not read whole
    assert kv_bytes_per_token(m, torch.float32) == 6 * 2 * 2 * 16 * 4
    assert kv_bytes_per_token(m, torch.bfloat16) == 6 * 2 * 2 * 16 * 2
    t = DecodeTraffic()
    t.add_batch([5, 3], [4, 2])  # 3 and 1 decode steps: contexts 6,7,8 and 4
    assert (t.steps, t.kv_token_reads) == (3, 6 + 7 + 8 + 4)
    t.add_batch([2], [1])  # the prefill made the only token: no decode step
    assert (t.steps, t.kv_token_reads) == (3, 25)
    assert t.bytes(1000, 10) == 3 * 1000 + 25 * 10


def test_llama_3_1_8b_shape_on_meta(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(PRESETS["llama-3.1-8b"]))
    cfg = ModelConfig.from_hf(shape_config(str(path)))
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.vocab_size, cfg.rope.type) == (4096, 32, 32, 8, 14336, 128256, "llama3")
    m = build_on_meta(LlamaForCausalLM, cfg, torch.bfloat16)
    assert sum(p.numel() for p in m.parameters()) == 8_030_261_248
    # bf16 weights one decode step reads (the 128256 x 4096 input embedding excepted), and the KV of one token
    assert weight_bytes_per_step(m) == 2 * (8_030_261_248 - 128256 * 4096) == 15_009_849_344
    assert kv_bytes_per_token(m, torch.bfloat16) == 32 * 2 * 8 * 128 * 2


def test_qwen3_30b_a3b_shape_reads_its_active_experts():
    """The qwen3-30b-a3b preset; a mixture of experts counts the routed experts one token reads (num_experts_per_tok of
    num_experts per layer), not all of them: Qwen3-30B-A3B's published 30.5B parameters, of which a one-row step reads
    ~3.0B (3.3B active less the input embedding)."""
    cfg = ModelConfig.from_hf(shape_config("qwen3-30b-a3b"))  # the preset `bench --random-weights` takes
    m = build_on_meta(get_model_class(cfg.architecture), cfg, torch.bfloat16)
    assert sum(p.numel() for p in m.parameters()) == 30_532_122_624
    expert = 3 * 2048 * 768
    assert weight_bytes_per_step(m) == 2 * (30_532_122_624 - 151936 * 2048 - 48 * (128 - 8) * expert)
    assert kv_bytes_per_token(m, torch.bfloat16) == 48 * 2 * 4 * 128 * 2


def test_kimi_slice_shape():
    """The kimi-k2.5-slice preset: Kimi-K2.5's text width, MLA and 384 experts in three layers (a dense one, two MoE),
    36.97B parameters (benchmarks/kimi_slice.py's count); a one-row step reads 8 of each MoE layer's experts."""
    cfg = ModelConfig.from_hf(shape_config("kimi-k2.5-slice"))
    assert (cfg.mla.kv_lora_rank, cfg.moe.n_routed_experts, cfg.moe.num_experts_per_tok) == (512, 384, 8)
    m = build_on_meta(get_model_class(cfg.architecture), cfg, torch.bfloat16)
    total = sum(p.numel() for p in m.parameters())
    assert round(total / 1e9, 2) == 36.97
    expert, router = 3 * 7168 * 2048, 384 * 7168 + 384  # the router's weight and bias stay float32: 2 bytes more
    assert weight_bytes_per_step(m) == 2 * (total - 163840 * 7168 - 2 * (384 - 8) * expert) + 2 * 2 * router


def test_gpt_oss_20b_shape():
    """The gpt-oss-20b preset: openai/gpt-oss-20b's published 20.91B parameters (its experts in bf16 here); a one-row
    step reads 4 of each layer's 32 experts (with their biases) and, past the input embedding, 3.61B parameters."""
    cfg = ModelConfig.from_hf(shape_config("gpt-oss-20b"))
    assert (cfg.moe.n_routed_experts, cfg.moe.num_experts_per_tok, cfg.moe.swiglu_limit) == (32, 4, 7.0)
    assert [cfg.window_of(i) for i in range(4)] == [128, None, 128, None]
    m = build_on_meta(get_model_class(cfg.architecture), cfg, torch.bfloat16)
    total = sum(p.numel() for p in m.parameters())
    assert total == 20_914_757_184
    expert = 3 * 2880 * 2880 + 2 * 2880 + 2880  # gate, up, down and their biases
    assert weight_bytes_per_step(m) == 2 * (total - 201088 * 2880 - 24 * (32 - 4) * expert) == 2 * 3_608_307_264
    assert kv_bytes_per_token(m, torch.bfloat16) == 24 * 2 * 8 * 64 * 2


def test_qwen2_5_7b_shape():
    """The qwen2.5-7b preset: Qwen2.5-7B-Instruct's published 7,615,616,512 parameters, q/k/v with biases and o_proj
    without (the GEMV kernel's biased projections at one row)."""
    cfg = ModelConfig.from_hf(shape_config("qwen2.5-7b"))
    m = build_on_meta(get_model_class(cfg.architecture), cfg, torch.bfloat16)
    assert sum(p.numel() for p in m.parameters()) == 7_615_616_512
    attn = m.model.layers[0].self_attn
    assert all(getattr(attn, n).bias is not None for n in ("q_proj", "k_proj", "v_proj")) and attn.o_proj.bias is None
    assert kv_bytes_per_token(m, torch.bfloat16) == 28 * 2 * 4 * 128 * 2


def test_random_model_and_drafter_materialise():
    loaded = random_model("smollm2-135m", torch.device("cpu"), torch.float32, seed=3)
    m = loaded.model
    assert loaded.tokenizer is None and not any(p.is_meta for p in m.parameters())
    assert m.lm_head.weight is m.model.embed_tokens.weight  # tied again after to_empty
    assert torch.all(m.model.norm.weight == 1) and 0.015 < m.lm_head.weight.std().item() < 0.025
    assert torch.isfinite(m.model.rotary.inv_freq).all()
    d = random_drafter(loaded.config, torch.device("cpu"), torch.float32, seed=3)
    assert d.draft_vocab_size == 32000 and d.fc.weight.shape == (576, 3 * 576)
    targets = d.to_target_ids(torch.arange(32000))
    assert torch.all(targets[1:] > targets[:-1]) and 0 <= targets.min() and targets.max() < 49152
    assert int(d.t2d.sum()) == 32000 and torch.all(d.t2d[targets])


def test_bench_on_the_static_path(chat_model, prompt_file, tmp_path, capsys, monkeypatch):
    """The GPU fast path's bucketed all-rows steps (GraphCache without capture): rows finish at different times in a
    static batch, the oracle still reads its row's reference, and outputs stay identical to the baseline's."""
    from eaglespec.bench import runs
    from eaglespec.engine.cuda_graphs import GraphCache
    from eaglespec.engine.engine import Engine

    def static_engine(*args, **kw):
        eng = Engine(*args, **kw)
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
        return eng

    monkeypatch.setattr(runs, "Engine", static_engine)
    out = tmp_path / "out"
    code, _, err = run_cli(
        ["bench", "--model", chat_model, "--prompts", prompt_file, "--batch-sizes", "3", "--spec", "3,1,4",
         "--spec", "4,2,6", "--draft", "oracle", "--draft", "random", "--max-new-tokens", "10", "--device", "cpu",
         "--out", out], capsys)
    assert code == 0, err
    recs = json.loads((out / "results.json").read_text())["records"]
    assert len(recs) == 5 and all(r["identical_outputs"] == 3 for r in recs)
    bw = recs[0]["bandwidth"]  # graph steps are not timed one by one: the wall time less the prefills
    assert bw["decode_seconds_from"] == "wall minus prefill" and bw["decode_seconds"] > 0 and bw["achieved_gb_s"] > 0
    for r in recs:
        if r["drafter"] == "oracle":
            top = min(r["steps"], r["draft_tokens"] - 1) + 1
            assert r["accept_length_hist"][str(top)] >= r["verify_steps"] - 3


def spy_generate(cr, monkeypatch) -> list[tuple[list[list[int]], int]]:
    """Record (prompts, max_new_tokens) of every generate call a ConfigRun makes (the calls still run)."""
    calls: list[tuple[list[list[int]], int]] = []
    real = cr.engine.generate

    def spy(prompts, params, chat=True):
        calls.append(([list(p) for p in prompts], params.max_new_tokens))
        return real(prompts, params, chat=chat)

    monkeypatch.setattr(cr.engine, "generate", spy)
    return calls


def test_prefill_pass_meets_every_timed_batch_untimed(monkeypatch):
    """The warm-up's prefill pass generates one token for every chunk the timed run will see (same rows, same
    prompts, split as the timed run splits them), and leaves nothing in the record or the phase timer."""
    from eaglespec.bench.runs import ConfigRun, RunConfig
    from eaglespec.config import EngineConfig
    from eaglespec.sampling_params import SamplingParams

    cr = ConfigRun(tiny_llama(seed=0), None, RunConfig.plain(), 2, EngineConfig())
    calls = spy_generate(cr, monkeypatch)
    groups = [[[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]], [[11, 12], [13]]]
    cr.prefill_pass(groups, SamplingParams(max_new_tokens=9))
    assert calls == [([[1, 2, 3], [4, 5]], 1), ([[6, 7, 8, 9, 10]], 1), ([[11, 12], [13]], 1)]
    rec = cr.record()
    assert rec.outputs == [] and rec.seconds == 0 and all(v == 0 for v in rec.phases.values())
    cr.close()


def test_bench_continuous_batching(chat_model, prompt_file, tmp_path, capsys):
    """--batching continuous: all prompts queued, 2 running at a time; outputs equal plain greedy decoding's, the
    engine's batched steps are reported, and the baseline's traffic counts the decode steps the engine ran."""
    out = tmp_path / "out"
    code, stdout, err = run_cli(
        ["bench", "--model", chat_model, "--prompts", prompt_file, "--batch-sizes", "2", "--batching", "continuous",
         "--spec", "3,1,4", "--spec", "2,2,4", "--draft", "random", "--max-new-tokens", "9", "--ignore-eos",
         "--device", "cpu", "--out", out], capsys)
    assert code == 0, err
    doc = json.loads((out / "results.json").read_text())
    check_schema(doc)
    assert doc["batching"] == "continuous" and "continuous batching" in stdout
    base, *spec = doc["records"]
    assert all(r["batching"] == "continuous" and r["identical_outputs"] == 3 for r in doc["records"])
    # 3 prompts through 2 rows: the first two are admitted together, the third once a row frees (all are 9 tokens)
    assert base["engine_steps"] == {"prefill": 2, "decode": 16}
    assert base["bandwidth"]["decode_steps"] == 16
    for r in spec:
        es = r["engine_steps"]
        assert set(es) == {"prefill", "spec"} and es["prefill"] == 2
        assert es["spec"] <= r["verify_steps"]  # a batched step verifies every running row


def test_continuous_prefill_pass_and_admission_shapes(monkeypatch):
    """Continuous batching's prefill pass sends each group as one queue, and with prefill graphs it also meets one
    batch of r copies per (rows r <= PREFILL_GRAPH_ROWS, length bucket) the prompts reach."""
    from eaglespec.bench.runs import ConfigRun, RunConfig
    from eaglespec.config import EngineConfig
    from eaglespec.engine.cuda_graphs import PREFILL_GRAPH_ROWS, GraphCache
    from eaglespec.sampling_params import SamplingParams

    cr = ConfigRun(tiny_llama(seed=0), None, RunConfig.plain(), 3, EngineConfig(), batching="continuous")
    calls = spy_generate(cr, monkeypatch)
    groups = [[[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [3, 3]], [[11, 12], [13]]]
    cr.prefill_pass(groups, SamplingParams(max_new_tokens=9))  # the CPU engine has no graphs: no admission shapes
    assert calls == [(groups[0], 1), (groups[1], 1)]
    rec = cr.record()
    assert rec.outputs == [] and rec.steps == {} and all(v == 0 for v in rec.phases.values())
    cr.engine.reserve(3, 256)  # graph buckets never exceed the cache rows' length
    cr.engine.runner.graphs = GraphCache(cr.engine.runner, capture=False)
    long = list(range(1, 81))  # 80 tokens: the 128 bucket; the others fall in the 64 bucket
    shapes = cr._admission_shapes([[1, 2, 3], long, [6, 7, 8, 9, 10]])
    rows = min(3, PREFILL_GRAPH_ROWS)
    assert shapes == [[[6, 7, 8, 9, 10]] * r for r in range(1, rows + 1)] + [[long] * r for r in range(1, rows + 1)]
    cr.close()


def test_random_weights_of_other_norms(tmp_path):
    """--random-weights for shapes whose norms are not RMSNorms: Cohere's LayerNorm weights 1 (a zero weight would
    silence every layer), Gemma's offsets 0 (a scale of 1); the models answer with finite logits."""
    import json

    from eaglespec.layers.context import ForwardContext
    from eaglespec.layers.norm import BiasFreeLayerNorm, OffsetRMSNorm

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128)
    for arch, mt, cls, want in (("Cohere2ForCausalLM", "cohere2", BiasFreeLayerNorm, 1.0),
                                ("Gemma3ForCausalLM", "gemma3_text", OffsetRMSNorm, 0.0)):
        path = tmp_path / f"{mt}.json"
        path.write_text(json.dumps(dict(base, architectures=[arch], model_type=mt, sliding_window=16)))
        model = random_model(str(path), torch.device("cpu"), torch.float32).model
        norms = [m.weight for m in model.modules() if isinstance(m, cls)]
        assert norms and all(bool((w == want).all()) for w in norms)
        logits = model(torch.tensor([[1, 2, 3]]), ForwardContext.plain(1, 3)).logits
        assert torch.isfinite(logits).all() and logits.abs().max() > 0
