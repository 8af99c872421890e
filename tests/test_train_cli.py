"""`eaglespec train` end to end on a tiny HF Llama folder written here (config.json + model.safetensors + a ChatML
character tokenizer), and the regeneration it runs: turn by turn, first turn only, cached in resumable shards."""

from __future__ import annotations

import json
import re

import pytest
import torch
from tiny import tiny_llama

from eaglespec.api import load_drafter
from eaglespec.cli import main
from eaglespec.config import EngineConfig
from eaglespec.engine.engine import Engine
from eaglespec.loading import Tokenizer, load_model, save_safetensors
from eaglespec.sampling_params import SamplingParams
from eaglespec.train.regenerate import RegenConfig, regenerate

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def char_tokenizer() -> Tokenizer:
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models

    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for c in "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\n-":
        vocab[c] = len(vocab)
    backend = Backend(models.BPE(vocab, [], unk_token="<unk>"))
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    backend.decoder = decoders.Fuse()
    return Tokenizer(backend, bos_token="<|im_start|>", eos_token="<|im_end|>", chat_template=CHATML)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_llama(seed=0, vocab=80, eos_token_id=2)
    cfg = dict(model.config.raw)
    cfg["torch_dtype"] = "float32"
    (d / "config.json").write_text(json.dumps(cfg))
    save_safetensors(model.state_dict(), d / "model.safetensors")
    char_tokenizer().save(d)
    return d


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("data") / "chat.jsonl"
    rows = []
    for i in range(24):
        msgs = [{"role": "user", "content": f"what is {i} plus {i}?"}, {"role": "assistant", "content": f"{2 * i}."}]
        if i % 3 == 0:
            msgs += [{"role": "user", "content": "and times two?"}, {"role": "assistant", "content": f"{4 * i}!"}]
        rows.append(json.dumps({"messages": msgs}))
    f.write_text("\n".join(rows) + "\n")
    return f


def test_train_command_end_to_end(tiny_folder, data_file, tmp_path, capsys):
    out = tmp_path / "drafter"
    args = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--out", str(out), "--device", "cpu",
            "--max-steps", "6", "--ttt-steps", "3", "--draft-vocab", "40", "--batch-tokens", "400",
            "--max-len", "96", "--regen-max-new-tokens", "10", "--regen-shard", "8", "--eval-frac", "0.2",
            "--save-every", "3", "--max-shard-mb", "0.1", "--no-progress", "--lr", "1e-3"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "read 24 conversations" in err and "exported the drafter" in err and "estimated chain acceptance" in err
    work = tmp_path / "drafter-work"
    assert len(list(work.glob("regen-*/shard-*.jsonl"))) == 3
    assert sorted(p.name for p in (work / "checkpoints").glob("*.pt")) == ["step-00000003.pt", "step-00000006.pt"]
    log = [json.loads(x) for x in (work / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3, 4, 5, 6] and "eval" in log[-1]
    assert all(r["seconds"] > 0 for r in log if "loss" in r)  # each step's wall time
    assert re.search(r"regenerated 24 conversations \(\d+ new tokens in this run, \d+ s, \d+ new tokens/s\)", err)
    assert re.search(r"trained 6 steps in \d+ s, evaluations and checkpoints included \(\d\.\d{3} s per step alone, "
                     r"\d+ tokens/s\)", err)

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 40
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 2]
    assert (out / "model.safetensors.index.json").is_file()
    d = load_drafter(out, "cpu", torch.float32)
    assert d.config.eagle.draft_vocab_size == 40 and int(d.t2d.sum()) == 40

    # the exported folder drives speculative generation from the command line
    assert main(["generate", "what is 3 plus 3?", "--model", str(tiny_folder), "--draft", str(out),
                 "--device", "cpu", "--max-new-tokens", "8", "--steps", "3", "--topk", "1"]) == 0
    assert "accept length" in capsys.readouterr().err

    # a second run reuses the regeneration cache (nothing is generated again)
    assert main(args) == 0
    assert re.search(r"\(0 new tokens in this run, \d+ s\)", capsys.readouterr().err)  # no rate without tokens


def test_train_continues_from_an_exported_drafter(tiny_folder, data_file, tmp_path, capsys):
    """--init warm-starts from an export (several device sessions): its weights, vocabulary and aux layers are kept."""
    first, second = tmp_path / "d1", tmp_path / "d2"
    common = ["--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--ttt-steps", "2",
              "--batch-tokens", "400", "--max-len", "96", "--regen-max-new-tokens", "8", "--no-progress",
              "--export-dtype", "float32"]
    assert main(["train", *common, "--out", str(first), "--max-steps", "3", "--draft-vocab", "40",
                 "--aux-layers", "0,2,4", "--lr", "1e-3"]) == 0
    # a negligible lr: the continued run must export exactly what it started from, whatever --draft-vocab / --aux-layers say
    assert main(["train", *common, "--out", str(second), "--max-steps", "2", "--init", str(first),
                 "--draft-vocab", "50", "--aux-layers", "1,2,3", "--lr", "1e-30"]) == 0
    assert "(aux layers [0, 2, 4] kept, whatever --aux-layers says)" in capsys.readouterr().err
    a, b = load_drafter(first, "cpu", torch.float32), load_drafter(second, "cpu", torch.float32)
    assert b.config.eagle.aux_layer_ids == (0, 2, 4) and b.config.eagle.draft_vocab_size == 40
    assert torch.equal(a.d2t, b.d2t) and torch.equal(a.t2d, b.t2d)
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), n

    # with a wider shape the continued drafter is widened, its trained weights kept in place
    wide = tmp_path / "d3"
    assert main(["train", *common, "--out", str(wide), "--max-steps", "1", "--init", str(first), "--lr", "1e-30",
                 "--drafter-intermediate-size", "160", "--drafter-heads", "6"]) == 0
    w = load_drafter(wide, "cpu", torch.float32)
    assert (w.config.intermediate_size, w.config.num_attention_heads) == (160, 6)
    assert torch.equal(w.midlayer.mlp.up_proj.weight[:128], a.midlayer.mlp.up_proj.weight)
    assert w.midlayer.mlp.down_proj.weight[:, 128:].abs().max() < 1e-20  # zero, up to one step of lr 1e-30
    assert "widened the drafter layer from MLP 128 / 4 heads to MLP 160 / 6 heads" in capsys.readouterr().err
    assert main(["train", *common, "--out", str(tmp_path / "d4"), "--init", str(wide),
                 "--drafter-intermediate-size", "128"]) == 2
    assert "would narrow the --init drafter (160 / 6)" in capsys.readouterr().err

    # --rebuild-vocab: a vocabulary of --draft-vocab tokens from this data; the rows of tokens in both are kept
    revo = tmp_path / "d5"
    assert main(["train", *common, "--out", str(revo), "--max-steps", "1", "--init", str(first), "--lr", "1e-30",
                 "--rebuild-vocab", "--draft-vocab", "50"]) == 0
    assert "draft vocabulary rebuilt: 40 -> 50 tokens" in capsys.readouterr().err
    r = load_drafter(revo, "cpu", torch.float32)
    assert r.config.eagle.draft_vocab_size == 50 and int(r.t2d.sum()) == 50 and bool(r.t2d[a.t2d].all())
    old_id = a.t2d.long().cumsum(0) - 1  # draft id of each kept target id (ids ascending)
    new_id = r.t2d.long().cumsum(0) - 1
    kept = a.t2d.nonzero().flatten()
    assert torch.allclose(r.lm_head.weight[new_id[kept]], a.lm_head.weight[old_id[kept]], atol=1e-20)
    assert main(["train", *common, "--out", str(tmp_path / "d6"), "--rebuild-vocab", "--draft-vocab", "50"]) == 2
    assert "--rebuild-vocab needs --init" in capsys.readouterr().err
    assert main(["train", *common, "--out", str(tmp_path / "d7"), "--init", str(first), "--rebuild-vocab",
                 "--draft-vocab", "0"]) == 2
    err = capsys.readouterr().err
    assert "onto another of --draft-vocab tokens (below the target's 80): got --draft-vocab 0" in err


def assert_lossless(tiny_folder, drafter) -> None:
    """Greedy speculation (a small tree) with an exported drafter gives the tiny target's plain greedy tokens."""
    from eaglespec.config import SpecConfig

    target = load_model(tiny_folder, device="cpu", dtype=torch.float32)
    drafter.set_embed_and_head(*target.model.get_embed_and_head())
    prompts = [[1, 5, 6, 7], [1, 9, 9, 30, 31, 32]]
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = Engine(target.model, None, EngineConfig()).generate(prompts, params)
    spec = Engine(target.model, None, EngineConfig(), drafter=drafter, spec=SpecConfig(3, 2, 5)).generate(prompts,
                                                                                                         params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]


def test_train_a_wider_drafter_layer(tiny_folder, data_file, tmp_path, capsys):
    """--drafter-intermediate-size / --drafter-heads widen the one drafter layer in the published format: the export
    says so in config.json, loads, and speculates losslessly; heads that do not group over the KV heads are refused
    in one line before any work."""
    out = tmp_path / "wide"
    common = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--ttt-steps", "2",
              "--batch-tokens", "400", "--max-len", "96", "--regen-max-new-tokens", "8", "--no-progress",
              "--max-steps", "3", "--draft-vocab", "40", "--lr", "1e-3"]
    assert main([*common, "--out", str(out), "--drafter-intermediate-size", "256", "--drafter-heads", "8"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (256, 8, 2)
    d = load_drafter(out, "cpu", torch.float32)
    assert d.midlayer.mlp.down_proj.weight.shape[1] == 256
    assert_lossless(tiny_folder, d)
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "bad"), "--drafter-heads", "3"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the "read 24 conversations" line
    assert last.startswith("eaglespec: error: ")
    assert "must be a positive multiple of the target's 2 key/value heads" in last
    assert not (tmp_path / "bad-work").exists()


def test_train_a_multi_layer_drafter_and_deepen_another(tiny_folder, data_file, tmp_path, capsys):
    """--drafter-layers 2 trains vLLM's multi-layer EAGLE-3 drafter (config num_hidden_layers 2, layers.1.*), which
    loads and speculates losslessly; with --init it adds identity layers to an exported drafter, whose first layer is
    kept; 0 layers is refused in one line before any work."""
    common = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--ttt-steps", "2",
              "--batch-tokens", "400", "--max-len", "96", "--regen-max-new-tokens", "8", "--no-progress",
              "--draft-vocab", "40", "--export-dtype", "float32"]
    two, one, deep = tmp_path / "two", tmp_path / "one", tmp_path / "deep"
    assert main([*common, "--out", str(two), "--max-steps", "3", "--lr", "1e-3", "--drafter-layers", "2"]) == 0
    assert json.loads((two / "config.json").read_text())["num_hidden_layers"] == 2
    d = load_drafter(two, "cpu", torch.float32)
    assert d.num_layers == 2 and d.layers["1"].self_attn.q_proj.weight.shape == (64, 64)
    assert_lossless(tiny_folder, d)

    assert main([*common, "--out", str(one), "--max-steps", "2", "--lr", "1e-3"]) == 0
    capsys.readouterr()
    assert main([*common, "--out", str(deep), "--max-steps", "1", "--init", str(one), "--lr", "1e-30",
                 "--drafter-layers", "3"]) == 0
    assert "deepened the drafter from 1 to 3 decoder layers" in capsys.readouterr().err
    a, b = load_drafter(one, "cpu", torch.float32), load_drafter(deep, "cpu", torch.float32)
    assert b.num_layers == 3
    assert torch.allclose(b.midlayer.self_attn.q_proj.weight, a.midlayer.self_attn.q_proj.weight, atol=1e-20)
    assert b.layers["2"].mlp.down_proj.weight.abs().max() < 1e-20  # zero, up to one step of lr 1e-30

    assert main([*common, "--out", str(tmp_path / "bad"), "--drafter-layers", "0"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "eaglespec: error: --drafter-layers must be >= 1 (got 0)"
    assert not (tmp_path / "bad-work").exists()


def test_train_an_eagle31_drafter_and_add_its_norms_to_another(tiny_folder, data_file, tmp_path, capsys):
    """--fc-norm / --norm-before-fc / --norm-output train an EAGLE-3.1 drafter: config.json says so at the top level
    (as SGLang, vLLM and TensorRT-LLM read it) and the export loads; with --init they add the norms to a plain
    drafter, and a continued EAGLE-3.1 drafter keeps its own; both norms at once are refused in one line."""
    common = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--ttt-steps", "2",
              "--batch-tokens", "400", "--max-len", "96", "--regen-max-new-tokens", "8", "--no-progress",
              "--max-steps", "3", "--draft-vocab", "40", "--lr", "1e-3"]
    out = tmp_path / "e31"
    assert main([*common, "--out", str(out), "--fc-norm", "--norm-output"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True and "norm_before_fc" not in cfg
    d = load_drafter(out, "cpu", torch.float32)
    assert d.fc_norm is not None and d.norm_output
    # continued without the flags: it keeps them
    assert main([*common, "--out", str(tmp_path / "again"), "--init", str(out)]) == 0
    assert json.loads((tmp_path / "again" / "config.json").read_text())["fc_norm"] is True
    # a plain drafter given EAGLE-3.1's norms
    plain = tmp_path / "plain"
    assert main([*common, "--out", str(plain)]) == 0
    assert "norm_output" not in json.loads((plain / "config.json").read_text())
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "moved"), "--init", str(plain), "--norm-before-fc",
                 "--norm-output", "--eval-every", "3"]) == 0
    out, err = capsys.readouterr()
    assert "step 0: eval: loss" in out + err and "step 3: eval: loss" in out + err  # a continued drafter's start too
    assert "added EAGLE-3.1's norm_before_fc, norm_output to the drafter" in err
    assert "calibrated input_norm.weight on the target's aux states" in err
    moved = json.loads((tmp_path / "moved" / "config.json").read_text())
    assert moved["norm_before_fc"] is True and moved["norm_output"] is True
    assert main([*common, "--out", str(tmp_path / "bad"), "--fc-norm", "--norm-before-fc"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("eaglespec: error: ") and "are alternatives" in last


def test_train_loop_mask_is_applied_and_reported(tiny_folder, tmp_path, capsys):
    """--loop-keep reaches the dataset (the log counts the tokens it took out of the loss); a negative value is
    refused before any work, as are a negative --regen-stop-loop and one without regeneration."""
    data = tmp_path / "loops.jsonl"
    loop = "ab " * 40
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"say ab {i}"},
                                                       {"role": "assistant", "content": loop}]}) for i in range(6)))
    common = ["train", "--target", str(tiny_folder), "--data", str(data), "--device", "cpu", "--ttt-steps", "2",
              "--batch-tokens", "400", "--max-len", "160", "--no-regenerate", "--no-progress", "--max-steps", "1",
              "--draft-vocab", "40"]
    assert main([*common, "--out", str(tmp_path / "d"), "--loop-keep", "4"]) == 0
    err = capsys.readouterr().err
    # each answer: 119 characters = tokens (stripped), period 3, the 8-gram of 0..7 repeats at 10: 119 - 10 - 4 masked
    assert "loop mask: 630 assistant tokens lie deeper than 4 tokens into a repetition loop" in err
    assert main([*common, "--out", str(tmp_path / "e"), "--loop-keep", "-1"]) == 2
    assert "--loop-keep must be >= 0 (got -1)" in capsys.readouterr().err
    assert main([*common, "--out", str(tmp_path / "e"), "--regen-stop-loop", "-2"]) == 2
    assert "--regen-stop-loop must be >= 0 (got -2)" in capsys.readouterr().err
    assert main([*common, "--out", str(tmp_path / "e"), "--regen-stop-loop", "32"]) == 2  # with --no-regenerate
    assert "--regen-stop-loop ends regenerated answers, and --no-regenerate regenerates none" in capsys.readouterr().err


def test_feature_graphs_switch_reaches_the_trainer(tiny_folder, data_file, tmp_path, monkeypatch):
    """--no-feature-graphs makes the trainer run the target's features forward eagerly; by default it asks for the
    graphs (FeatureGraphs picks them on a GPU, and the forward itself on the CPU)."""
    import eaglespec.train.trainer as trainer_mod
    from eaglespec.train.feature_graphs import FeatureGraphs

    modes = []

    class Recording(FeatureGraphs):
        def __init__(self, *args, mode=None, **kw):
            modes.append(mode)
            super().__init__(*args, mode=mode, **kw)

    monkeypatch.setattr(trainer_mod, "FeatureGraphs", Recording)
    common = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--ttt-steps", "2",
              "--batch-tokens", "400", "--max-len", "96", "--no-regenerate", "--no-progress", "--max-steps", "1",
              "--draft-vocab", "40"]
    assert main([*common, "--out", str(tmp_path / "a")]) == 0
    assert main([*common, "--out", str(tmp_path / "b"), "--no-feature-graphs"]) == 0
    assert modes == [None, "eager"]


def test_loss_options_reach_the_checkpoint_and_bad_ones_are_refused(tiny_folder, data_file, tmp_path, capsys):
    """--ttt-align and --label-sharpen are the run's settings (what its checkpoints hold, what a resume must share);
    values out of range (these, --lr, --ttt-steps) stop with one line before the data is read or the target loaded."""
    import torch

    common = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--ttt-steps", "2",
              "--batch-tokens", "400", "--max-len", "96", "--no-regenerate", "--no-progress", "--max-steps", "1",
              "--draft-vocab", "40"]
    work = tmp_path / "w"
    assert main([*common, "--out", str(tmp_path / "a"), "--work-dir", str(work), "--ttt-align", "2",
                 "--label-sharpen", "1.5"]) == 0
    (ckpt,) = (work / "checkpoints").glob("step-*.pt")
    settings = torch.load(ckpt, weights_only=False)["settings"]
    assert settings["ttt_align"] == 2 and settings["label_sharpen"] == 1.5
    capsys.readouterr()
    for flag, value, message in (("--label-sharpen", "0", "--label-sharpen must be > 0 (got 0.0)"),
                                 ("--ttt-align", "-1", "--ttt-align must be >= 0 (got -1)"),
                                 ("--lr", "0", "--lr must be > 0 (got 0.0)"),
                                 ("--ttt-steps", "0", "--ttt-steps must be >= 1 (got 0)")):
        assert main([*common, "--out", str(tmp_path / "b"), flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("eaglespec: error: ") and message in err and "\n" not in err


def test_train_command_reports_bad_data_in_one_line(tiny_folder, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
                   '{"messages": [\n')
    bad.write_text(bad.read_text() + '{"messages": []}\n')
    assert main(["train", "--target", str(tiny_folder), "--data", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eaglespec: error: ") and f"{bad}, line 2: malformed JSON" in err and "\n" not in err
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert main(["train", "--data", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "is empty" in capsys.readouterr().err


def test_regeneration_turn_by_turn_cached_and_resumable(tiny_folder, tmp_path):
    loaded = load_model(tiny_folder, "cpu")
    target, tok = loaded.model, loaded.tokenizer
    convs = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "old"},
              {"role": "user", "content": "more"}, {"role": "assistant", "content": "old too"}] for i in range(5)]
    cfg = RegenConfig(max_new_tokens=6, max_len=128, shard_size=2)
    res = regenerate(target, tok, convs, tmp_path, cfg, progress=False)
    assert len(res.conversations) == 5 and res.new_tokens > 0
    assert all(c[1]["content"] not in ("", "old") and c[3]["content"] not in ("", "old too") for c in res.conversations)
    # each turn is the target's greedy answer given the regenerated turns before it
    eng = Engine(target, tok, EngineConfig(max_batch_size=4))
    p = SamplingParams(max_new_tokens=6)
    c = res.conversations[3]
    assert [m["role"] for m in c] == ["user", "assistant", "user", "assistant"]
    assert c[1]["content"] == eng.generate([c[:1]], p)[0].text.strip()
    assert c[3]["content"] == eng.generate([c[:3]], p)[0].text.strip()
    assert c[0] == convs[3][0] and c[2] == convs[3][2]
    # cached: nothing new; a lost shard is regenerated alone, identically
    shards = sorted(tmp_path.glob("regen-*/shard-*.jsonl"))
    assert len(shards) == 3
    again = regenerate(target, tok, convs, tmp_path, cfg, progress=False)
    assert again.new_tokens == 0 and again.conversations == res.conversations
    shards[1].unlink()
    partial = regenerate(target, tok, convs, tmp_path, cfg, progress=False)
    assert 0 < partial.new_tokens < res.new_tokens and partial.conversations == res.conversations
    # sampled: one engine serves every shard, reseeded per shard, so a lost shard is drawn again as the whole run drew it
    hot = RegenConfig(max_new_tokens=6, max_len=128, shard_size=2, temperature=1.0, seed=3)
    drawn = regenerate(target, tok, convs, tmp_path / "hot", hot, progress=False)
    assert drawn.conversations != res.conversations  # not the greedy answers
    lost = sorted((tmp_path / "hot").glob("regen-*/shard-*.jsonl"))[1]
    lost.unlink()
    again_drawn = regenerate(target, tok, convs, tmp_path / "hot", hot, progress=False)
    assert 0 < again_drawn.new_tokens < drawn.new_tokens and again_drawn.conversations == drawn.conversations
    # first turn only: one exchange per conversation, and another cache folder
    first = regenerate(target, tok, convs, tmp_path, RegenConfig(max_new_tokens=6, max_len=128, first_turn_only=True),
                       progress=False)
    assert all(len(c) == 2 for c in first.conversations)
    assert [c[1] for c in first.conversations] == [c[1] for c in res.conversations]
    assert len(list(tmp_path.glob("regen-*"))) == 2
    # a prompt that leaves no room for an answer drops the conversation (counted)
    long = [[{"role": "user", "content": "x" * 120}, {"role": "assistant", "content": "y"}]]
    dropped = regenerate(target, tok, long, tmp_path, cfg, progress=False)
    assert dropped.conversations == [] and dropped.dropped == {"no assistant turn fits --max-len": 1}


def script_evaluations(monkeypatch, scores: dict[int, float]) -> dict[int, dict]:
    """Held-out evaluations that report `scores[step]` as the estimated acceptance; returns the weights at each
    evaluated step (filled as the run goes)."""
    from eaglespec.train import trainer as trainer_mod

    snapshots: dict[int, dict] = {}
    real_evaluate = trainer_mod.Trainer.evaluate

    def scripted(self):
        res = real_evaluate(self)
        snapshots[self.step] = {n: p.detach().clone() for n, p in self.params.items()}
        return trainer_mod.EvalResult(acc=res.acc, loss=res.loss, accept_length=scores[self.step],
                                      positions=res.positions)

    monkeypatch.setattr(trainer_mod.Trainer, "evaluate", scripted)
    return snapshots


def test_export_takes_the_best_held_out_weights(tiny_folder, data_file, tmp_path, capsys, monkeypatch):
    """With --eval-every, the export holds the weights of the best held-out evaluation, not the last step's (here the
    evaluations are scripted to peak at step 4 of 8); --export-last exports the last weights."""
    from safetensors.torch import load_file

    snapshots = script_evaluations(monkeypatch, {2: 1.5, 4: 2.5, 6: 2.0, 8: 1.8})
    base = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--max-steps", "8",
            "--eval-every", "2", "--ttt-steps", "2", "--draft-vocab", "40", "--batch-tokens", "400", "--max-len", "96",
            "--regen-max-new-tokens", "10", "--eval-frac", "0.2", "--no-progress", "--lr", "3e-3",
            "--export-dtype", "float32", "--work-dir", str(tmp_path / "work")]
    assert main(base + ["--out", str(tmp_path / "best")]) == 0
    assert "exporting the weights of step 4" in capsys.readouterr().err
    exported = load_file(str(tmp_path / "best" / "model.safetensors"))
    assert torch.equal(exported["fc.weight"], snapshots[4]["fc.weight"])
    assert not torch.equal(snapshots[4]["fc.weight"], snapshots[8]["fc.weight"])  # the choice mattered
    assert main(base + ["--out", str(tmp_path / "last"), "--export-last"]) == 0
    last = load_file(str(tmp_path / "last" / "model.safetensors"))
    assert torch.equal(last["fc.weight"], snapshots[8]["fc.weight"])


def test_a_continued_drafters_start_is_a_baseline_never_the_export(tiny_folder, data_file, tmp_path, capsys,
                                                                   monkeypatch):
    """With --init the step-0 evaluation is the baseline: even where it scores highest (a held-out split holding
    prompts the starting drafter learnt inflates it; session 44 got its input back after 5,000 steps so), the export
    holds the best trained step's weights, the log warns with both estimates, and the checkpoint keeps the baseline
    apart from `best`. A checkpoint written when the start could win (best at step 0) resumes with no best."""
    from safetensors.torch import load_file

    common = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--ttt-steps", "2",
              "--draft-vocab", "40", "--batch-tokens", "400", "--max-len", "96", "--regen-max-new-tokens", "10",
              "--eval-frac", "0.2", "--no-progress", "--lr", "3e-3", "--export-dtype", "float32"]
    first = tmp_path / "first"
    assert main([*common, "--max-steps", "2", "--out", str(first), "--work-dir", str(tmp_path / "w1")]) == 0
    snapshots = script_evaluations(monkeypatch, {0: 3.0, 2: 1.5, 4: 2.5, 6: 2.0})
    capsys.readouterr()
    work = tmp_path / "w2"
    assert main([*common, "--max-steps", "6", "--eval-every", "2", "--init", str(first), "--out",
                 str(tmp_path / "second"), "--work-dir", str(work)]) == 0
    err = capsys.readouterr().err
    assert "exporting the weights of step 4: the best held-out estimated acceptance (2.500" in err
    assert "warning: the exported weights' held-out estimate (2.500) is below the starting drafter's (3.000" in err
    exported = load_file(str(tmp_path / "second" / "model.safetensors"))
    assert torch.equal(exported["fc.weight"], snapshots[4]["fc.weight"])
    assert not torch.equal(snapshots[0]["fc.weight"], snapshots[4]["fc.weight"])  # the choice mattered
    ckpt_path = sorted((work / "checkpoints").glob("step-*.pt"))[-1]
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    assert ckpt["best"]["step"] == 4 and ckpt["baseline"]["score"] == 3.0
    # an older checkpoint: its best is the start, and no baseline key
    ckpt["best"] = {"step": 0, "score": 3.0, "eval": ckpt["baseline"]["eval"], "weights": snapshots[0]}
    del ckpt["baseline"]
    torch.save(ckpt, ckpt_path)
    capsys.readouterr()  # resumed at its last step, the finished run exports again at once
    assert main([*common, "--max-steps", "6", "--eval-every", "2", "--init", str(first), "--out",
                 str(tmp_path / "third"), "--work-dir", str(work), "--resume"]) == 0
    assert "exporting the weights of step 0" not in capsys.readouterr().err
    third = load_file(str(tmp_path / "third" / "model.safetensors"))
    assert torch.equal(third["fc.weight"], snapshots[6]["fc.weight"])  # no trained best in it: the last weights


def test_the_held_out_split_has_its_own_seed(tiny_folder, data_file, tmp_path, monkeypatch):
    """--seed (shuffling, self prompts) leaves the held-out split alone, so a drafter continued with another seed is
    not scored on prompts it learnt; --eval-seed draws another split."""
    from eaglespec.train import pipeline

    held: list[list[int]] = []
    real_split = pipeline.split

    def recording(n, frac, seed, groups=None):
        train_idx, eval_idx = real_split(n, frac, seed, groups=groups)
        held.append(sorted(int(i) for i in eval_idx))
        return train_idx, eval_idx

    monkeypatch.setattr(pipeline, "split", recording)
    common = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--ttt-steps", "1",
              "--draft-vocab", "40", "--batch-tokens", "400", "--max-len", "96", "--regen-max-new-tokens", "6",
              "--eval-frac", "0.3", "--no-progress", "--max-steps", "1", "--export-dtype", "float32",
              "--work-dir", str(tmp_path / "w")]
    for i, extra in enumerate([["--seed", "0"], ["--seed", "3"], ["--seed", "3", "--eval-seed", "5"]]):
        assert main([*common, *extra, "--out", str(tmp_path / f"d{i}")]) == 0
    assert held[0] and held[0] == held[1]
    assert held[2] != held[0]


def test_train_stopped_by_sigterm_exits_143_with_a_checkpoint_and_resumes(tiny_folder, data_file, tmp_path, capsys,
                                                                         monkeypatch):
    """`timeout` (SIGTERM) in the middle of training: the run says where it stopped, exits with 128 + 15 and exports
    nothing; `--resume` finishes from the checkpoint and exports."""
    import os
    import signal

    from eaglespec.train import trainer as trainer_mod

    real_step = trainer_mod.Trainer.train_step

    def step_then_sigterm(self, ids):
        rec = real_step(self, ids)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return rec

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", step_then_sigterm)
    out = tmp_path / "d"
    args = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--out", str(out), "--device", "cpu",
            "--max-steps", "6", "--ttt-steps", "2", "--draft-vocab", "40", "--batch-tokens", "400", "--max-len", "96",
            "--regen-max-new-tokens", "10", "--eval-frac", "0.2", "--no-progress", "--save-every", "100"]
    old = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a regression must not end pytest itself
    try:
        assert main(args) == 143
    finally:
        signal.signal(signal.SIGTERM, old)
    err = capsys.readouterr().err
    assert "interrupted by SIGTERM at step 3 of 6, checkpoint saved: resume with --resume" in err
    assert not out.exists()
    ckpts = sorted(p.name for p in (tmp_path / "d-work" / "checkpoints").glob("*.pt"))
    assert ckpts == ["step-00000003.pt"]
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", real_step)
    assert main(args + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "resuming at step 3" in err and "exported the drafter" in err


def self_prompt_run(tiny_folder, data_file, out, *extra: str) -> list[str]:
    """A two-step training run on the tiny target that regenerates its data and writes prompts (`extra`)."""
    return ["train", "--target", str(tiny_folder), "--data", str(data_file), "--out", str(out), "--device", "cpu",
            "--max-steps", "2", "--ttt-steps", "2", "--draft-vocab", "40", "--batch-tokens", "400",
            "--max-len", "96", "--regen-max-new-tokens", "10", "--regen-shard", "8", "--regen-batch", "16",
            "--eval-frac", "0.2", "--no-progress", *extra]


def test_train_with_self_prompts(tiny_folder, data_file, tmp_path, capsys):
    """--self-prompts: the target writes prompts from its template's user turn, they are answered like the data
    (their own caches: the data's regeneration cache is the one a run without them made) and trained on."""
    args = self_prompt_run(tiny_folder, data_file, tmp_path / "drafter", "--self-prompts", "5")
    assert main(args) == 0
    err = capsys.readouterr().err
    m = re.search(r"self prompts: (\d+) written by the target \(\d+ s\), (\d+) answered", err)
    assert m and 1 <= int(m.group(1)) <= 5 and 1 <= int(m.group(2)) <= int(m.group(1))
    work = tmp_path / "drafter-work"
    (cache,) = work.glob("prompts-*.jsonl")
    assert len(cache.read_text().splitlines()) == 1 + int(m.group(1))
    assert len(list(work.glob("regen-*"))) == 2  # the data's and the self prompts' regenerations
    assert re.search(r"\d+ training / \d+ eval samples", err)
    assert main(args) == 0  # a second run generates nothing: both caches hold
    assert len(re.findall(r"\(0 new tokens in this run, \d+ s\)", capsys.readouterr().err)) == 2


def test_self_prompt_answers_at_their_own_temperature(tiny_folder, data_file, tmp_path, capsys):
    """--self-prompt-answer-temperature: the self prompts are answered at that temperature (a regeneration cache of
    their own), the data at --regen-temperature (its cache, made by a greedy run, holds)."""
    args = self_prompt_run(tiny_folder, data_file, tmp_path / "drafter", "--self-prompts", "5")
    assert main(args) == 0
    greedy = capsys.readouterr().err
    assert "answered at temperature" not in greedy
    work = tmp_path / "drafter-work"
    before = set(work.glob("regen-*"))
    assert main(args + ["--self-prompt-answer-temperature", "1"]) == 0
    err = capsys.readouterr().err
    m = re.search(r"self prompts: (\d+) written by the target \(\d+ s\), (\d+) answered at temperature 1 "
                  r"\((\d+) new tokens", err)
    assert m and int(m.group(3)) > 0  # the same prompts (their cache holds), answered anew
    assert re.search(r"regenerated \d+ conversations \(0 new tokens in this run", err)  # the data's cache holds
    (sampled,) = set(work.glob("regen-*")) - before

    def answers(folder):
        return [line for f in sorted(folder.glob("shard-*.jsonl")) for line in f.read_text().splitlines()]

    greedy_dirs = [d for d in before if len(answers(d)) == len(answers(sampled))]
    assert greedy_dirs and all(answers(d) != answers(sampled) for d in greedy_dirs)


def test_train_with_two_self_prompt_sets(tiny_folder, data_file, tmp_path, capsys):
    """Repeated --self-prompts / --self-prompt-openers: each set is written and answered with caches of its own, so
    adding a set to a finished run reuses the first set's prompts and answers and only writes the new one."""
    args = self_prompt_run(tiny_folder, data_file, tmp_path / "drafter", "--self-prompts", "4",
                           "--self-prompt-openers", "Write,Solve")
    assert main(args) == 0
    first = capsys.readouterr().err
    m = re.search(r"self prompts: (\d+) written by the target \(\d+ s\), (\d+) answered \((\d+) new tokens", first)
    assert m and int(m.group(3)) > 0
    work = tmp_path / "drafter-work"
    assert len(list(work.glob("prompts-*.jsonl"))) == 1
    assert main(args + ["--self-prompts", "3", "--self-prompt-openers", "Imagine you are"]) == 0
    err = capsys.readouterr().err
    again = re.search(r"self prompts 1 \(Write,Solve\): (\d+) written by the target \(\d+ s\), (\d+) answered "
                      r"\((\d+) new tokens", err)
    assert again and again.group(1, 2) == m.group(1, 2) and again.group(3) == "0"  # the first set from its caches
    new = re.search(r"self prompts 2 \(Imagine you are\): (\d+) written by the target.*?, (\d+) answered", err)
    assert new and 1 <= int(new.group(1)) <= 3
    caches = sorted(work.glob("prompts-*.jsonl"), key=lambda f: f.stat().st_mtime)
    assert len(caches) == 2
    texts = [json.loads(line)["prompt"] for line in caches[-1].read_text().splitlines()[1:]]
    assert texts and all(t.startswith("Imagine you are") for t in texts)
    assert len(list(work.glob("regen-*"))) == 3  # the data's and one per set
    assert re.search(r"\d+ training / \d+ eval samples", err)


def test_eval_prompts_are_answered_and_reported_but_never_choose_the_weights(tiny_folder, data_file, tmp_path,
                                                                             capsys):
    """--eval-prompts (mt-bench or a prompts JSONL in any of bench's forms) has the target answer those prompts and
    evaluates the drafter on them at every evaluation, beside the held-out split: logged, printed at the end, never
    the basis of the exported weights; without regeneration, or with token-id prompts, it is refused before the
    model load."""
    prompts = tmp_path / "probe.jsonl"
    prompts.write_text("\n".join(json.dumps(x) for x in [
        {"prompt": "what is 7 plus 7?"}, {"turns": ["what is 9 plus 9?", "and times two?"]},
        {"messages": [{"role": "user", "content": "what is 3 plus 3?"}]}]) + "\n")
    common = ["train", "--target", str(tiny_folder), "--data", str(data_file), "--device", "cpu", "--ttt-steps", "2",
              "--batch-tokens", "400", "--max-len", "96", "--regen-max-new-tokens", "8", "--no-progress",
              "--max-steps", "4", "--draft-vocab", "40", "--lr", "1e-3", "--eval-prompts", str(prompts)]
    assert main([*common, "--out", str(tmp_path / "d"), "--eval-every", "2", "--eval-frac", "0.2"]) == 0
    out, err = capsys.readouterr()
    assert "eval prompts probe: 3 of 3 answered by the target" in err
    for step in (2, 4):
        assert f"step {step}: eval: loss" in out + err and f"step {step}: probe eval: loss" in out + err
    assert err.strip().splitlines()[-1].startswith("probe eval: loss")
    log = [json.loads(x) for x in (tmp_path / "d-work" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r.get("eval_set") == "probe"] == [2, 4]
    # no held-out split: the prompt set is still reported, and the last weights are exported (it chose nothing)
    assert main([*common, "--out", str(tmp_path / "e"), "--eval-frac", "0",
                 "--work-dir", str(tmp_path / "d-work")]) == 0
    out, err = capsys.readouterr()
    assert "step 4: probe eval: loss" in out + err and "exporting the weights of step" not in err
    assert "0 eval samples" in err and "\neval: loss" not in err
    assert load_drafter(tmp_path / "e", "cpu", torch.float32) is not None
    # refused before the model load
    assert main([*common, "--out", str(tmp_path / "f"), "--no-regenerate"]) == 2
    assert "--eval-prompts needs regeneration (the target answers those prompts)" in capsys.readouterr().err
    ids = tmp_path / "ids.jsonl"
    ids.write_text(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    assert main([*common[:-1], str(ids), "--out", str(tmp_path / "g")]) == 2
    assert "prompt 1 is token ids; the target answers text prompts" in capsys.readouterr().err
    assert not (tmp_path / "f-work").exists() and not (tmp_path / "g-work").exists()
    # prompts longer than --max-len: said in the log, and training goes on without that set
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "what is " + "seven plus " * 30 + "seven?"}) + "\n")
    assert main([*common[:-1], str(long), "--out", str(tmp_path / "h")]) == 0
    err = capsys.readouterr().err
    assert "eval prompts long: 0 of 1 answered by the target" in err and "none fits --max-len" in err


def test_mt_bench_as_eval_prompts():
    from eaglespec.train.pipeline import prompt_set_conversations

    name, convs = prompt_set_conversations("mt-bench")
    assert name == "mt-bench" and len(convs) == 80
    assert all(len(c) == 2 and c[0]["role"] == "user" and c[0]["content"] and c[1]["role"] == "assistant"
               for c in convs)  # first turns only, and the stub the target's answer replaces
