"""Training end to end on a tiny target with learnable structure: a few hundred TTT steps lift the per-step accuracy
and the measured acceptance length far above an untrained drafter's; the export loads back with `load_drafter` and
speculative greedy output still equals plain greedy output. Also: resume equals an uninterrupted run, and a wrapper
that delegates the protocol trains exactly like its language model."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from safetensors import safe_open
from tiny import llama_config, tiny_llama
from wrappers import DelegatingWrapper

from eaglespec.api import load_drafter
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import ConfigError
from eaglespec.sampling_params import SamplingParams
from eaglespec.train.dataset import TokenDataset
from eaglespec.train.drafter import (DrafterShape, deepen_drafter, drafter_hf_config, new_drafter, revocab_drafter,
                                    trainable_parameters, widen_drafter)
from eaglespec.train.export import check_shard_limit, export_drafter
from eaglespec.train.trainer import TrainConfig, Trainer
from eaglespec.train.vocab import build_draft_vocab, count_tokens

SPEC = SpecConfig(steps=4, topk=1, draft_tokens=5)
GEN = SamplingParams(max_new_tokens=40, ignore_eos=True)
ENGINE = EngineConfig(max_batch_size=64)


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def learnable_target():
    """A tiny random Llama whose attention is weak: its greedy text is diverse (~24 distinct tokens in 40) but mostly
    driven by the last few tokens, which a one-layer drafter can learn in a few hundred steps."""
    t = tiny_llama(seed=0)
    with torch.no_grad():
        for layer in t.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.02)
    return t


@pytest.fixture(scope="module")
def setup():
    target = learnable_target()
    V = target.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
               for _ in range(120)]
    outs = Engine(target, None, ENGINE).generate(prompts, GEN)  # the target's own text, as regeneration gives
    samples = [(p + o.token_ids, [False] * len(p) + [True] * len(o.token_ids)) for p, o in zip(prompts, outs)]
    ds = TokenDataset.from_samples(samples)
    train_ds, eval_ds = ds.subset(range(100)), ds.subset(range(100, 120))
    vocab = build_draft_vocab(count_tokens(train_ds.tokens, train_ds.mask, V), 50)
    test_prompts = [torch.randint(0, V, (5,), generator=g).tolist() for _ in range(8)]
    plain = [o.token_ids for o in Engine(target, None, ENGINE).generate(test_prompts, GEN)]
    assert sum(len(set(p)) for p in plain) / len(plain) > 12  # not a degenerate, repetitive target
    return target, train_ds, eval_ds, vocab, test_prompts, plain


def measured_accept_length(target, drafter, prompts, plain) -> float:
    eng = Engine(target, None, ENGINE, drafter=drafter, spec=SPEC)
    outs = eng.generate(prompts, GEN)
    assert [o.token_ids for o in outs] == plain  # lossless whatever the drafter
    return eng.stats.accept_length_mean


def config(tmp_path, **kw) -> TrainConfig:
    base = dict(work_dir=str(tmp_path / "work"), aux_layers=(1, 2, 2), ttt_steps=4, lr=3e-3, batch_tokens=512,
                save_every=0, progress=False)
    base.update(kw)
    return TrainConfig(**base)


def test_training_lifts_acceptance_and_export_round_trips(setup, tmp_path):
    target, train_ds, eval_ds, vocab, prompts, plain = setup
    untrained = new_drafter(target, (1, 2, 2), vocab, seed=0)
    tau0 = measured_accept_length(target, untrained, prompts, plain)

    drafter = new_drafter(target, (1, 2, 2), vocab, seed=0)
    tr = Trainer(target, drafter, train_ds, eval_ds, vocab, config(tmp_path, max_steps=300))
    acc0 = tr.evaluate().acc
    history = tr.fit()
    assert len(history) == 300 and history[-1].loss < history[0].loss - 3
    res = tr.evals[-1][1]
    assert res.acc[0] > 0.3 and res.acc[0] > 4 * max(acc0[0], 0.02)
    assert all(a > 0.25 for a in res.acc)
    assert res.accept_length > 1.5
    # the chain's conditional accuracy: step 0 counts every position, as the plain one; later steps only those
    # whose earlier drafts were right, where this target's text is easier
    assert res.chain_acc[0] == res.acc[0] and res.chain_accept_length > 1.5
    drafter.eval()
    tau = measured_accept_length(target, drafter, prompts, plain)
    assert tau > tau0 + 0.4, (tau0, tau)

    # export (bf16, the published layout) and load back through the public API
    out = tmp_path / "drafter"
    files = export_drafter(drafter, out)
    assert [f.name for f in files] == ["model.safetensors"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 50 and cfg["vocab_size"] == target.config.vocab_size
    assert cfg["target_hidden_size"] == target.config.hidden_size and cfg["tie_word_embeddings"] is False
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 2, 2], "use_aux_hidden_state": True}
    assert cfg["torch_dtype"] == "bfloat16"
    with safe_open(str(files[0]), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert torch.equal(f.get_tensor("d2t"), vocab.d2t)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight",
            "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight"} <= names
    assert not any(n.startswith(("embed_tokens", "model.")) for n in names)
    loaded = load_drafter(out, "cpu", torch.float32)
    assert torch.equal(loaded.fc.weight, drafter.fc.weight.to(torch.bfloat16).float())
    tau_loaded = measured_accept_length(target, loaded, prompts, plain)
    assert tau_loaded > tau0 + 0.3

    # sharded export: same tensors, spread over files no larger than the limit
    sharded = tmp_path / "sharded"
    parts = export_drafter(drafter, sharded, max_shard_mb=0.1)
    assert len(parts) > 1 and (sharded / "model.safetensors.index.json").is_file()
    assert all(p.stat().st_size <= 0.1 * (1 << 20) for p in parts)
    again = load_drafter(sharded, "cpu", torch.float32)
    for n, b in again.state_dict().items():
        assert torch.equal(loaded.state_dict()[n], b), n
    with pytest.raises(ConfigError, match=r"fc.weight \(64 x 192 in bfloat16, 0.02 MiB\) cannot fit"):
        export_drafter(drafter, tmp_path / "tiny", max_shard_mb=0.07)


@pytest.mark.parametrize("setting,value,default,bad,message", [
    ("ttt_align", 1, 0, -1, "--ttt-align must be >= 0"),
    ("label_sharpen", 2.0, 1.0, 0.0, "--label-sharpen must be > 0"),
], ids=["aligned", "sharpened"])
def test_loss_options_train_evaluate_as_published_and_resume_only_alike(setup, tmp_path, setting, value, default, bad,
                                                                        message):
    """--ttt-align 1 (later steps train only where the earlier drafts were right) and --label-sharpen 2 (labels
    p^2, renormalised): the drafter still learns (lossless, acceptance well above the untrained one's); its
    evaluation is the published one (every position, the target's own distributions: a trainer without the setting
    evaluates the same weights to the same numbers); a checkpoint resumes only under the same setting, and one of an
    earlier eaglespec (the setting absent) as the default."""
    target, train_ds, eval_ds, vocab, prompts, plain = setup
    tau0 = measured_accept_length(target, new_drafter(target, (1, 2, 2), vocab, seed=0), prompts, plain)
    drafter = new_drafter(target, (1, 2, 2), vocab, seed=0)
    tr = Trainer(target, drafter, train_ds, eval_ds, vocab, config(tmp_path, max_steps=300, save_every=100,
                                                                   **{setting: value}))
    history = tr.fit()
    assert history[-1].loss < history[0].loss - 2
    res = tr.evals[-1][1]
    again = Trainer(target, drafter, train_ds, eval_ds, vocab, config(tmp_path / "other")).evaluate()
    assert again.loss == pytest.approx(res.loss, rel=1e-6) and again.acc == res.acc
    assert again.positions == res.positions and res.positions[3] > 0
    assert res.acc[0] > 0.3 and res.chain_accept_length > 1.5
    drafter.eval()
    tau = measured_accept_length(target, drafter, prompts, plain)
    assert tau > tau0 + 0.4, (tau0, tau)

    def resumed(**kw):
        return Trainer(target, new_drafter(target, (1, 2, 2), vocab, seed=0), train_ds, None, vocab,
                       config(tmp_path, max_steps=300, resume=True, **kw))

    with pytest.raises(ConfigError, match=f"{setting}={value!r}, this run has {setting}={default!r}"):
        resumed()
    assert resumed(**{setting: value}).step == 300
    ckpt = sorted((tmp_path / "work" / "checkpoints").glob("step-*.pt"))[-1]
    state = torch.load(ckpt, weights_only=False)
    del state["settings"][setting]
    torch.save(state, ckpt)
    with pytest.raises(ConfigError, match=f"{setting}={default!r}, this run has {setting}={value!r}"):
        resumed(**{setting: value})
    assert resumed().step == 300
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, **{setting: bad})


def trained_looking_drafter(setup, work):
    """A new drafter far from its init (every weight matters), with its held-out evaluation and measured acceptance:
    the baseline a drafter rebuilt from it (wider, deeper) must match exactly."""
    target, train_ds, eval_ds, vocab, prompts, plain = setup
    drafter = new_drafter(target, (1, 2, 2), vocab, seed=3)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad and p.dim() == 2:
                p.mul_(6.0)
    before = Trainer(target, drafter, train_ds, eval_ds, vocab, config(work)).evaluate()
    return drafter, before, measured_accept_length(target, drafter, prompts, plain)


def test_widened_drafter_computes_the_same_function_then_trains_its_new_units(setup, tmp_path):
    """A continued drafter widened Net2Net-style (more MLP units and query heads) scores exactly as before on the
    held-out TTT loss and at inference, its new units start from zero output and move with the first step, and
    narrowing or heads off the KV groups are refused."""
    target, train_ds, eval_ds, vocab, prompts, plain = setup
    drafter, before, tau = trained_looking_drafter(setup, tmp_path / "a")

    wide = widen_drafter(drafter, DrafterShape(intermediate_size=200, num_attention_heads=6), seed=1)
    assert (wide.config.intermediate_size, wide.config.num_attention_heads) == (200, 6)
    assert (wide.config.raw["intermediate_size"], wide.config.raw["num_attention_heads"]) == (200, 6)  # the export's
    assert wide.midlayer.self_attn.q_proj.weight.shape == (6 * 16, 128)
    # KV group 0 keeps its heads 0-1 as heads 0-1, group 1 its heads 2-3 as heads 3-4 (a new head after each group)
    q0 = drafter.midlayer.self_attn.q_proj.weight.view(4, 16, -1)  # [heads, head_dim, 2H]
    q1 = wide.midlayer.self_attn.q_proj.weight.view(6, 16, -1)
    assert torch.equal(q1[[0, 1, 3, 4]], q0)
    tr = Trainer(target, wide, train_ds, eval_ds, vocab, config(tmp_path / "b", max_steps=1, lr=1e-3))
    after = tr.evaluate()
    assert after.loss == pytest.approx(before.loss, rel=1e-5) and after.acc == pytest.approx(before.acc, abs=1e-6)
    assert measured_accept_length(target, wide, prompts, plain) == pytest.approx(tau, abs=1e-9)
    new_down = wide.midlayer.mlp.down_proj.weight[:, 128:]
    assert not new_down.any()
    tr.fit()
    assert new_down.abs().sum() > 0 and wide.midlayer.self_attn.o_proj.weight.view(64, 6, 16)[:, 2].abs().sum() > 0

    with pytest.raises(ConfigError, match=r"would narrow the --init drafter \(128 / 4\)"):
        widen_drafter(drafter, DrafterShape(intermediate_size=64))
    with pytest.raises(ConfigError, match="multiple of the drafter's 2 key/value heads"):
        widen_drafter(drafter, DrafterShape(num_attention_heads=5))
    assert widen_drafter(drafter, DrafterShape()) is drafter


def test_deepened_drafter_computes_the_same_function_then_trains_its_new_layers(setup, tmp_path):
    """A continued drafter given two more decoder layers (vLLM's multi-layer EAGLE-3) scores exactly as before, held
    out and at inference, since the new layers' outputs start at zero; training moves them; the export names them
    layers.1.* / layers.2.* and loads back; removing layers is refused."""
    target, train_ds, eval_ds, vocab, prompts, plain = setup
    drafter, before, tau = trained_looking_drafter(setup, tmp_path / "a")

    deep = deepen_drafter(drafter, DrafterShape(num_hidden_layers=3), seed=1)
    assert deep.num_layers == 3 and deep.config.raw["num_hidden_layers"] == 3
    assert {f"layers.{i}.self_attn.q_proj.weight" for i in (1, 2)} <= set(trainable_parameters(deep))
    for n, t in drafter.state_dict().items():
        if not n.startswith("embed_tokens."):
            assert torch.equal(deep.state_dict()[n], t), n
    tr = Trainer(target, deep, train_ds, eval_ds, vocab, config(tmp_path / "b", max_steps=3, lr=1e-3))
    after = tr.evaluate()
    assert after.loss == pytest.approx(before.loss, rel=1e-6) and after.acc == pytest.approx(before.acc, abs=1e-6)
    assert measured_accept_length(target, deep, prompts, plain) == pytest.approx(tau, abs=1e-9)
    outs = [deep.layers[i].self_attn.o_proj.weight for i in "12"] + [deep.layers[i].mlp.down_proj.weight
                                                                      for i in "12"]
    assert not any(w.any() for w in outs)
    q0 = deep.layers["2"].self_attn.q_proj.weight.detach().clone()
    tr.fit()
    assert all(w.abs().sum() > 0 for w in outs)
    assert not torch.equal(deep.layers["2"].self_attn.q_proj.weight, q0)  # once o_proj moved, its inputs learn too

    out = tmp_path / "deep"
    export_drafter(deep, out, dtype=torch.float32)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {"layers.1.input_layernorm.weight", "layers.2.mlp.down_proj.weight"} <= set(f.keys())
        assert not any(n.startswith("layers.0.") or ".hidden_norm" in n and n.startswith("layers.") for n in f.keys())
    loaded = load_drafter(out, "cpu", torch.float32)
    for n, t in deep.state_dict().items():
        if not n.startswith("embed_tokens."):
            assert torch.equal(loaded.state_dict()[n], t), n
    tau_deep = measured_accept_length(target, loaded, prompts, plain)  # lossless (asserted inside)
    # widening reaches every layer: the later ones' MLP and heads grow too, the function stays
    wide = widen_drafter(deep, DrafterShape(intermediate_size=200, num_attention_heads=6), seed=1)
    assert wide.layers["2"].mlp.down_proj.weight.shape == (64, 200)
    assert wide.layers["1"].self_attn.q_proj.weight.shape == (6 * 16, 64)
    assert measured_accept_length(target, wide, prompts, plain) == pytest.approx(tau_deep, abs=1e-9)

    with pytest.raises(ConfigError, match=r"--drafter-layers 2 would remove layers from the --init drafter \(3\)"):
        deepen_drafter(deep, DrafterShape(num_hidden_layers=2))
    assert deepen_drafter(drafter, DrafterShape()) is drafter


def test_revocab_keeps_trained_rows_and_starts_new_ones_from_the_target_head(setup):
    """A drafter moved onto another draft vocabulary (rebuilt from more data, or larger) keeps everything but its
    lm_head, whose rows of tokens both vocabularies hold are the trained ones and whose new rows are zero (so it
    drafts as before); it still speculates losslessly."""
    target, train_ds, _, vocab, prompts, plain = setup
    drafter = new_drafter(target, (1, 2, 2), vocab, seed=3)
    with torch.no_grad():
        drafter.lm_head.weight.add_(0.5)  # trained rows differ from the target's
    counts = count_tokens(train_ds.tokens, train_ds.mask, target.config.vocab_size)
    counts[vocab.kept[:10]] = 0  # ten old tokens leave, other tokens come in
    bigger = build_draft_vocab(counts, 70)
    moved = revocab_drafter(drafter, bigger)
    assert moved.config.eagle.draft_vocab_size == 70 and moved.config.raw["draft_vocab_size"] == 70
    assert torch.equal(moved.d2t, bigger.d2t) and torch.equal(moved.t2d, bigger.t2d)
    old_id, new_id = vocab.target_to_draft, bigger.target_to_draft
    both = (vocab.t2d & bigger.t2d).nonzero().flatten()
    only_new = (bigger.t2d & ~vocab.t2d).nonzero().flatten()
    assert len(both) >= 40 and len(only_new) >= 20
    assert torch.equal(moved.lm_head.weight[new_id[both]], drafter.lm_head.weight[old_id[both]])
    assert not moved.lm_head.weight[new_id[only_new]].any()
    for n, t in drafter.state_dict().items():
        if not n.startswith(("lm_head", "d2t", "t2d")):
            assert torch.equal(moved.state_dict()[n], t), n
    measured_accept_length(target, moved, prompts, plain)  # lossless (asserted inside)
    assert revocab_drafter(drafter, vocab) is drafter
    shared = new_drafter(target, (1, 2, 2), None, seed=3)
    with pytest.raises(ConfigError, match="shares the target's lm_head"):
        revocab_drafter(shared, bigger)


def test_shard_limit_is_checked_before_training_with_a_hint():
    smol = llama_config(vocab=49152, layers=30, hidden=576, num_attention_heads=9, num_key_value_heads=3,
                        intermediate_size=1536)
    check_shard_limit(drafter_hf_config(smol, (1, 14, 26), 8192), torch.bfloat16, 16)  # 9 MiB lm_head: fits
    with pytest.raises(ConfigError) as e:
        check_shard_limit(drafter_hf_config(smol, (1, 14, 26), 32000), torch.bfloat16, 16)
    msg = str(e.value)
    assert msg.startswith("lm_head.weight (32000 x 576 in bfloat16, 35.16 MiB) cannot fit")
    n = int(msg.rsplit("--draft-vocab ", 1)[1].split()[0])
    check_shard_limit(drafter_hf_config(smol, (1, 14, 26), n), torch.bfloat16, 16)
    with pytest.raises(ConfigError):
        check_shard_limit(drafter_hf_config(smol, (1, 14, 26), n + 64), torch.bfloat16, 16)


def fresh_run(setup, work, max_steps: int, **kw):
    """A new drafter (seed 0) trained `max_steps` steps of <= 1024 tokens in `work`: (trainer, its records)."""
    target, train_ds, _, vocab, _, _ = setup
    d = new_drafter(target, (1, 2, 2), vocab, seed=0)
    tr = Trainer(target, d, train_ds, None, vocab, config(work, max_steps=max_steps, batch_tokens=1024, **kw))
    return tr, tr.fit()


def test_resume_reaches_the_uninterrupted_state(setup, tmp_path):
    target, train_ds, _, vocab, _, _ = setup

    def run(work, **kw):
        return fresh_run(setup, work, 14, **kw)

    full_tr, full = run(tmp_path / "a")
    assert len(full_tr.batches) < 14  # the run crosses an epoch boundary
    part_tr, part = run(tmp_path / "b", stop_after=5)
    assert len(part) == 5 and part_tr.step == 5
    assert list((tmp_path / "b" / "work" / "checkpoints").glob("step-00000005.pt"))
    rest_tr, rest = run(tmp_path / "b", resume=True)
    assert [r.step for r in rest] == list(range(6, 15))
    assert [r.loss for r in part + rest] == [r.loss for r in full]
    assert [r.lr for r in part + rest] == [r.lr for r in full]
    for n, p in full_tr.params.items():
        assert torch.equal(p, rest_tr.params[n]), n
    with pytest.raises(ConfigError, match="lr"):
        run(tmp_path / "b", resume=True, lr=1e-3)
    # the same samples and batches with another loss mask (what another --loop-keep gives) are refused too
    masked = TokenDataset(train_ds.tokens, train_ds.mask.clone(), train_ds.offsets, train_ds.dropped)
    masked.mask[torch.nonzero(masked.mask)[::3, 0]] = False
    d = new_drafter(target, (1, 2, 2), vocab, seed=0)
    with pytest.raises(ConfigError, match="loss mask differ"):
        Trainer(target, d, masked, None, vocab, config(tmp_path / "b", max_steps=14, batch_tokens=1024,
                                                       resume=True)).fit()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_training_with_a_checkpoint_that_resumes(setup, tmp_path, monkeypatch, sig):
    """SIGTERM (`timeout`, a scheduler) or SIGINT (Ctrl-C) during `fit`: the step in progress ends, a checkpoint of it
    is written, `interrupted` names the signal, the handlers are given back, and `--resume` reaches the state of an
    uninterrupted run. A second signal acts at once (the previous handler is back from the first one on)."""
    def run(work, **kw):
        return fresh_run(setup, work, 10, **kw)

    full_tr, full = run(tmp_path / "a")
    real_step = Trainer.train_step
    seen_inside: list = []

    def step_then_signal(self, ids):
        rec = real_step(self, ids)
        if self.step == 3:  # the record of step 4: the signal arrives while it runs
            os.kill(os.getpid(), sig)
            seen_inside.append(signal.getsignal(sig))  # the previous handler again, for a second signal
        return rec

    outside: list[int] = []

    def before(signum, frame):  # ours while the test runs: a regression must not end pytest itself
        outside.append(signum)

    old = signal.signal(sig, before)
    try:
        monkeypatch.setattr(Trainer, "train_step", step_then_signal)
        part_tr, part = run(tmp_path / "b")
        monkeypatch.setattr(Trainer, "train_step", real_step)
        assert signal.getsignal(sig) is before
    finally:
        signal.signal(sig, old)
    assert part_tr.interrupted == sig and part_tr.step == 4 and len(part) == 4 and outside == []
    assert seen_inside == [before]
    assert [p.name for p in (tmp_path / "b" / "work" / "checkpoints").glob("*.pt")] == ["step-00000004.pt"]
    rest_tr, rest = run(tmp_path / "b", resume=True)
    assert rest_tr.interrupted is None and [r.step for r in rest] == list(range(5, 11))
    assert [r.loss for r in part + rest] == [r.loss for r in full]
    for n, p in full_tr.params.items():
        assert torch.equal(p, rest_tr.params[n]), n
    # catch_signals=False leaves the signal alone: SIGINT then raises KeyboardInterrupt as usual
    if sig == signal.SIGINT:
        monkeypatch.setattr(Trainer, "train_step", step_then_signal)
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path / "c", catch_signals=False)


def test_wrapper_target_trains_like_its_language_model(setup, tmp_path):
    target, train_ds, _, vocab, _, _ = setup
    wrapped = DelegatingWrapper(target)
    losses = []
    for i, t in enumerate((target, wrapped)):
        d = new_drafter(t, (1, 2, 2), vocab, seed=0)
        tr = Trainer(t, d, train_ds, None, vocab, config(tmp_path / str(i), max_steps=3))
        losses.append([r.loss for r in tr.fit()])
    assert losses[0] == losses[1]


def test_best_held_out_weights_are_kept_resumed_and_loaded(setup, tmp_path):
    """With evaluations every few steps the trainer keeps the weights of the best held-out estimate (also across a
    resume); `use_best()` loads them, and evaluating them again gives that estimate."""
    target, train_ds, eval_ds, vocab, _, _ = setup

    def run(**kw):
        d = new_drafter(target, (1, 2, 2), vocab, seed=0)
        return Trainer(target, d, train_ds, eval_ds, vocab, config(tmp_path, max_steps=12, eval_every=3,
                                                                    save_every=3, lr=3e-2, **kw))

    tr = run(stop_after=6)
    tr.fit()
    assert [s for s, _ in tr.evals] == [3, 6] and tr.best["step"] in (3, 6)
    first_best = tr.best
    tr2 = run(resume=True)  # the best of the first session comes back with the checkpoint
    assert tr2.best["step"] == first_best["step"] and tr2.best["score"] == first_best["score"]
    tr2.fit()
    scores = {s: r.accept_length for s, r in tr2.evals} | {first_best["step"]: first_best["score"]}
    best_step = max(scores, key=lambda s: (scores[s], -s))  # the first of equal scores is kept
    assert tr2.best["step"] == best_step and tr2.best["score"] == scores[best_step]
    assert tr2.use_best() == best_step
    assert abs(tr2.evaluate().accept_length - scores[best_step]) < 1e-6
