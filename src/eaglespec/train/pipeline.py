"""The whole recipe for one target, in order: regenerate, tokenise, split, draft vocabulary, train, export.

Contract of `train_drafter(target, tokenizer, conversations, out, options)` -> `TrainSummary`:
1. (optional) regenerate the assistant turns with the target (regenerate.py, cached under `work_dir/regen-*`), and
   add the `self_prompts` sets, prompts written by the target, answered the same way (self_prompts.py; each set
   has its own caches, so adding a set keeps the others'; a prompt already in an earlier set is left out); with
   `eval_prompts` (e.g. `mt-bench`) also those prompts, answered the same way, as an evaluation set of their own;
2. tokenise with the chat template and the assistant loss mask, apply --max-len (dataset.py);
3. split off about `eval_frac` for evaluation (whole prompt groups, each by a hash of (`eval_seed`, its prompt): adding
   data or changing the training seed never moves a sample across);
4. count the assistant tokens of the training split and keep the `draft_vocab` most frequent (vocab.py;
   None or >= the vocabulary: no draft vocabulary, the drafter shares the target's lm_head);
5. build the drafter (drafter.py; or continue from `init`, an exported drafter, keeping its vocabulary and aux layers,
   widened to `shape` where that is wider, refused where narrower, given the EAGLE-3.1 norms `shape` adds, an added
   aux norm calibrated on the target's aux states; with `rebuild_vocab` moved onto a vocabulary of `draft_vocab`
   tokens built from this data, its trained lm_head rows kept, the new ones zero), train it with TTT (trainer.py;
   the held-out split chooses the exported weights among the trained steps; a continued drafter's step 0 is the
   baseline they are compared with; the `eval_prompts` set is only reported), export it to `out`
   (export.py).
The target is used only through the EAGLE-3 protocol and its forward (plus `Engine.generate` when regenerating), so a
wrapper that delegates the protocol works. Progress lines go to `log` (stderr in the CLI).
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ..config import EAGLE31_FLAGS
from ..errors import ConfigError
from .conversations import DataError, Message
from .dataset import TokenDataset, build_dataset, split
from .drafter import (DrafterShape, calibrate_aux_norms, deepen_drafter, drafter_from_checkpoint, drafter_hf_config,
                      drafter_shape, new_drafter, renorm_drafter, revocab_drafter, widen_drafter)
from .export import check_shard_limit, export_drafter
from .regenerate import RegenConfig, regenerate
from .self_prompts import SelfPromptConfig, prompt_key, self_prompts
from .trainer import EvalResult, Trainer, TrainConfig
from .vocab import DraftVocab, build_draft_vocab, count_tokens

if TYPE_CHECKING:
    from ..loading.tokenizer import BaseTokenizer


@dataclass
class PipelineOptions:
    train: TrainConfig
    regen: RegenConfig | None = RegenConfig()  # None: train on the conversations as they are
    max_len: int = 2048
    long: str = "truncate"  # or "drop"
    draft_vocab: int | None = 32000  # None or 0: no draft vocabulary
    eval_frac: float = 0.02
    # the held-out split's seed, apart from train.seed: a run with another seed (new self prompts, another shuffle),
    # e.g. a drafter continued with `init`, holds out the same prompt groups, so it is not scored on what it learnt
    eval_seed: int = 0
    export_dtype: torch.dtype = torch.bfloat16
    max_shard_mb: float | None = None
    target_name: str = "target"  # part of the regeneration cache key
    init: str | None = None  # an exported drafter to continue from (its vocabulary and aux layers are kept)
    rebuild_vocab: bool = False  # with `init`: a new draft vocabulary of `draft_vocab` tokens from this data
    export_best: bool = True  # export the weights of the best held-out evaluation (False: the last weights)
    shape: DrafterShape = DrafterShape()  # the drafter layer's sizes (an --init drafter is widened to them)
    loop_keep: int | None = None  # mask the loss deeper than this into repetition loops (dataset.mask_loops)
    # sets of prompts the target writes itself, each steered by its own openers (needs `regen`)
    self_prompts: tuple[SelfPromptConfig, ...] = ()
    # the temperature their answers are regenerated at (None: regen's): e.g. sampled answers to the self prompts
    # beside greedy ones to the data (session 53: a drafter trained on answers sampled at T = 1 alone gained at T = 1
    # and lost at T = 0)
    self_prompt_answer_temperature: float | None = None
    # a prompt set (`mt-bench` or a JSONL of prompts, bench/datasets.py) the target answers, evaluated beside the
    # held-out split at every evaluation (needs `regen`; reported only, it never chooses the exported weights)
    eval_prompts: str | None = None


@dataclass
class TrainSummary:
    out: Path
    files: list[Path]
    samples: int
    eval_samples: int
    tokens: int
    loss_tokens: int
    vocab_coverage: float
    steps: int
    final_loss: float | None
    eval: EvalResult | None
    dropped: dict[str, int] = field(default_factory=dict)
    extra_evals: dict[str, EvalResult] = field(default_factory=dict)  # the last evaluation of each eval_prompts set
    interrupted: int | None = None  # the signal (SIGINT / SIGTERM) that stopped training, with a checkpoint


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check_aux_layers(ids: Sequence[int], n_layers: int) -> tuple[int, ...]:
    ids = tuple(int(i) for i in ids)
    if len(ids) != 3:
        raise ConfigError(f"--aux-layers needs 3 layer ids (the drafter's fc takes 3 states), got {list(ids)}")
    bad = [i for i in ids if not 0 <= i < n_layers]
    if bad:
        raise ConfigError(f"--aux-layers {list(ids)} include {bad}, outside the target's {n_layers} layers")
    return ids


def prompt_set_conversations(name: str, regenerate: bool = True) -> tuple[str, list[list[Message]]]:
    """`mt-bench` or a prompts JSONL (bench/datasets.py's forms) -> (its label, per prompt its user turn or message
    list and an assistant stub, which regeneration replaces by the target's answer). Without regeneration there are
    no answers, and token-id prompts have no text to template: ConfigError."""
    from ..bench.datasets import load_prompt_set

    if not regenerate:
        raise ConfigError("--eval-prompts needs regeneration (the target answers those prompts): drop "
                          "--no-regenerate")

    convs: list[list[Message]] = []
    stub: Message = {"role": "assistant", "content": "."}  # the turn regeneration answers (as self_prompts.py)
    for i, item in enumerate(load_prompt_set(name)):
        if isinstance(item.first, str):
            convs.append([{"role": "user", "content": item.first}, dict(stub)])
        elif item.first and isinstance(item.first[0], dict):
            convs.append([dict(m) for m in item.first] + [dict(stub)])
        else:
            raise ConfigError(f"--eval-prompts {name}: prompt {i + 1} is token ids; the target answers text prompts")
    if not convs:
        raise ConfigError(f"--eval-prompts {name} holds no prompt")
    return (name if name == "mt-bench" else Path(name).stem), convs


def _took(t0: float, new_tokens: int) -> str:
    """'12 s, 34567 new tokens/s' since perf_counter() read t0 (the rate only where there were new tokens)."""
    s = time.perf_counter() - t0
    return f"{s:.0f} s" + (f", {new_tokens / max(s, 1e-9):.0f} new tokens/s" if new_tokens else "")


def train_drafter(target: torch.nn.Module, tokenizer: "BaseTokenizer", conversations: Sequence[Sequence[Message]],
                  out: str | Path, opts: PipelineOptions, log: Callable[[str], None] = _stderr) -> TrainSummary:
    tcfg = target.config
    init = drafter_from_checkpoint(target, opts.init) if opts.init else None
    added: list[str] = []  # EAGLE-3.1 norms added to the --init drafter
    if init is not None:  # the drafter's own aux layers and vocabulary size win over the options
        init_aux = tuple(init[0].config.eagle.aux_layer_ids or tcfg.default_aux_layer_ids())
        # a wider `shape` widens it (the same function at the start); narrowing is refused before any work
        # (deeper: new layers that pass the residual stream through)
        before = drafter_shape(init[0])
        init = (renorm_drafter(deepen_drafter(widen_drafter(init[0], opts.shape, opts.train.seed), opts.shape,
                                              opts.train.seed + 1), opts.shape), init[1])
        after = drafter_shape(init[0])
        if (after.intermediate_size, after.num_attention_heads) != (before.intermediate_size,
                                                                    before.num_attention_heads):
            log(f"widened the drafter layer from MLP {before.intermediate_size} / {before.num_attention_heads} heads "
                f"to MLP {after.intermediate_size} / {after.num_attention_heads} heads")
        if after.num_hidden_layers != before.num_hidden_layers:
            log(f"deepened the drafter from {before.num_hidden_layers} to {after.num_hidden_layers} decoder layers "
                "(the new ones start as the identity)")
        added = [n for n in EAGLE31_FLAGS if getattr(after, n) > getattr(before, n)]
        if added:
            log(f"added EAGLE-3.1's {', '.join(added)} to the drafter (training re-adapts it)")
        if opts.rebuild_vocab and (init[1] is None or not opts.draft_vocab
                                   or opts.draft_vocab >= tcfg.vocab_size):
            raise ConfigError("--rebuild-vocab moves a drafter with its own draft vocabulary onto another of "
                              f"--draft-vocab tokens (below the target's {tcfg.vocab_size}): "
                              + ("the --init drafter shares the target's lm_head" if init[1] is None
                                 else f"got --draft-vocab {opts.draft_vocab or 0}"))
        opts = replace(opts, train=replace(opts.train, aux_layers=init_aux), shape=after,
                       draft_vocab=opts.draft_vocab if opts.rebuild_vocab
                       else init[1].size if init[1] is not None else None)
    elif opts.rebuild_vocab:
        raise ConfigError("--rebuild-vocab needs --init (the drafter whose vocabulary is rebuilt)")
    aux = check_aux_layers(opts.train.aux_layers, tcfg.num_hidden_layers)
    vocab_n = opts.draft_vocab if opts.draft_vocab and opts.draft_vocab < tcfg.vocab_size else None
    # fail before any work when the drafter shape does not fit the target or the export cannot honour the shard limit
    check_shard_limit(drafter_hf_config(tcfg, aux, vocab_n, shape=opts.shape), opts.export_dtype, opts.max_shard_mb)
    max_len = min(opts.max_len, tcfg.context_limit)  # a sliding window or LongRoPE caps it (ModelConfig)
    work = Path(opts.train.work_dir)
    dropped: dict[str, int] = {}

    convs = list(conversations)
    if opts.regen is not None:
        rcfg = RegenConfig(**{**opts.regen.__dict__, "max_len": max_len})
        t0 = time.perf_counter()
        res = regenerate(target, tokenizer, convs, work, rcfg, opts.target_name, progress=opts.train.progress)
        convs = res.conversations
        dropped.update(res.dropped)
        log(f"regenerated {len(convs)} conversations ({res.new_tokens} new tokens in this run, "
            f"{_took(t0, res.new_tokens)})")
        seen: set[str] = set()  # user texts of earlier sets (case and whitespace folded)
        answer_t = rcfg.temperature if opts.self_prompt_answer_temperature is None \
            else opts.self_prompt_answer_temperature
        for i, spc in enumerate(opts.self_prompts):
            # their own cache and regeneration: the data's regeneration cache stays valid
            t0 = time.perf_counter()
            own = self_prompts(target, tokenizer, spc, work, opts.target_name, opts.train.progress)
            t1 = time.perf_counter()
            written = len(own)
            own = [c for c in own if prompt_key(c[0]["content"]) not in seen]
            seen.update(prompt_key(c[0]["content"]) for c in own)
            res = regenerate(target, tokenizer, own, work, replace(rcfg, first_turn_only=True, temperature=answer_t),
                             opts.target_name, progress=opts.train.progress)
            convs += res.conversations
            dropped.update(res.dropped)
            name = f"self prompts {i + 1} ({','.join(spc.openers) or 'free'})" if len(opts.self_prompts) > 1 \
                else "self prompts"
            repeats = f", {written - len(own)} already in an earlier set" if written > len(own) else ""
            at = f" at temperature {answer_t:g}" if answer_t != rcfg.temperature else ""
            log(f"{name}: {written} written by the target{repeats} ({t1 - t0:.0f} s), {len(res.conversations)} "
                f"answered{at} ({res.new_tokens} new tokens in this run, {_took(t1, res.new_tokens)})")
        if not convs:
            raise DataError("no conversation is left after regeneration (prompts longer than --max-len?)")

    extra_eval: dict[str, TokenDataset] = {}
    if opts.eval_prompts:
        name, asked = prompt_set_conversations(opts.eval_prompts, opts.regen is not None)
        assert opts.regen is not None
        res = regenerate(target, tokenizer, asked, work, replace(rcfg, first_turn_only=True), opts.target_name,
                         progress=opts.train.progress)
        extra_eval[name] = build_dataset(tokenizer, res.conversations, max_len, opts.long, opts.loop_keep)
        log(f"eval prompts {name}: {len(extra_eval[name])} of {len(asked)} answered by the target ({res.new_tokens} "
            "new tokens in this run), evaluated beside the held-out split"
            + ("" if len(extra_eval[name]) else ": none fits --max-len, so there is nothing to evaluate"))

    ds = build_dataset(tokenizer, convs, max_len, opts.long, opts.loop_keep)
    if opts.loop_keep is not None:
        log(f"loop mask: {ds.loop_masked} assistant tokens lie deeper than {opts.loop_keep} tokens into a repetition "
            "loop and carry no loss")
    if ds.trimmed:
        log(f"trimmed: {ds.trimmed} tokens after the samples' last loss tokens (no loss, no effect on the loss: cut)")
    dropped.update(ds.dropped)
    if dropped:
        log("dropped: " + ", ".join(f"{n} {why}" for why, n in sorted(dropped.items())))
    if len(ds) == 0:
        raise DataError(f"no training sample is left after tokenisation ({dict(ds.dropped)})")
    # held-out samples share no opening prompt with training samples (ShareGPT repeats prompts)
    train_idx, eval_idx = split(len(ds), opts.eval_frac, opts.eval_seed, groups=ds.prompt_keys())
    train_ds, eval_ds = ds.subset(train_idx), ds.subset(eval_idx)
    counts = count_tokens(train_ds.tokens, train_ds.mask, tcfg.vocab_size)
    if init is not None and init[1] is not None and not opts.rebuild_vocab:
        vocab = init[1]
    elif vocab_n is not None:
        vocab = build_draft_vocab(counts, vocab_n)
    else:
        V = tcfg.vocab_size
        vocab = DraftVocab(torch.zeros(V, dtype=torch.int64), torch.ones(V, dtype=torch.bool))
    coverage = vocab.coverage(counts)
    log(f"{len(train_ds)} training / {len(eval_ds)} eval samples, {len(train_ds.tokens)} tokens "
        f"({int(train_ds.mask.sum())} assistant); draft vocabulary {vocab.size} covers {coverage:.2%} of them")

    if init is not None:
        drafter = init[0]
        # its aux layers (and, without --rebuild-vocab, its vocabulary) are the ones its weights were trained on
        log(f"continuing from the drafter in {opts.init} (aux layers {list(opts.train.aux_layers)} kept, "
            "whatever --aux-layers says)")
        if opts.rebuild_vocab:
            assert init[1] is not None
            shared = int((init[1].t2d & vocab.t2d).sum())
            log(f"draft vocabulary rebuilt: {init[1].size} -> {vocab.size} tokens ({shared} in both keep their "
                f"trained rows; the drafter's covered {init[1].coverage(counts):.2%} of the assistant tokens)")
            drafter = revocab_drafter(drafter, vocab)
    else:
        drafter = new_drafter(target, aux, vocab if vocab_n is not None else None, seed=opts.train.seed,
                              shape=opts.shape)
    trainer = Trainer(target, drafter, train_ds, eval_ds if len(eval_ds) else None, vocab, opts.train, extra_eval)
    if init is not None and trainer.step == 0 and set(added) & {"norm_before_fc", "fc_norm"}:
        # a just-added aux norm (weight 1) would feed fc inputs of another scale than it was trained on
        set_ = calibrate_aux_norms(drafter, trainer.aux_sample())
        log(f"calibrated {', '.join(set_)} on the target's aux states (per channel: norm(x) * w ~ x), so fc starts "
            "from about the inputs it was trained on")
    log(f"training {sum(p.numel() for p in trainer.params.values())} parameters for {trainer.total_steps} steps "
        f"({len(trainer.batches)} batches per epoch, TTT {opts.train.ttt_steps} steps, device {trainer.device})"
        + (f", resuming at step {trainer.step}" if trainer.step else ""))
    t0, step0 = time.perf_counter(), trainer.step
    history = trainer.fit()
    if trainer.step > step0:
        seconds = time.perf_counter() - t0
        steps = trainer.step - step0
        in_steps = sum(r.seconds for r in history)
        log(f"trained {steps} steps in {seconds:.0f} s, evaluations and checkpoints included ({in_steps / steps:.3f} s "
            f"per step alone, {sum(r.tokens for r in history) / max(in_steps, 1e-9):.0f} tokens/s)")
    final_eval = trainer.evals[-1][1] if trainer.evals else None
    files: list[Path] = []
    if trainer.step >= trainer.total_steps:
        if opts.export_best and trainer.best is not None and trainer.best["step"] != trainer.step:
            # the run ends with an evaluation, so `final_eval` (the last step's) exists whenever `best` does
            trainer.use_best()
            log(f"exporting the weights of step {trainer.best['step']}: the best held-out estimated acceptance "
                f"({trainer.best['score']:.3f}; the last step's: {final_eval.accept_length:.3f})")
            final_eval = EvalResult(**trainer.best["eval"])
        if trainer.baseline is not None and final_eval is not None \
                and final_eval.accept_length < trainer.baseline["score"]:
            log(f"warning: the exported weights' held-out estimate ({final_eval.accept_length:.3f}) is below the "
                f"starting drafter's ({trainer.baseline['score']:.3f}, --init). Either training did not help, or the "
                "held-out split holds prompts the starting drafter was trained on (another --eval-seed than its "
                "run's, or data it saw elsewhere), which favours it: compare both on prompts neither trained on "
                f"(--eval-prompts, or eaglespec bench --draft {out} --draft {opts.init})")
        files = export_drafter(drafter, out, opts.export_dtype, opts.max_shard_mb)
        log(f"exported the drafter to {out} ({', '.join(f.name for f in files)})")
    elif trainer.interrupted is not None:
        log(f"interrupted by {signal.Signals(trainer.interrupted).name} at step {trainer.step} of "
            f"{trainer.total_steps}, checkpoint saved: resume with --resume to finish and export")
    else:
        log(f"stopped at step {trainer.step} of {trainer.total_steps}: resume with --resume to finish and export")
    return TrainSummary(
        out=Path(out), files=files, samples=len(train_ds), eval_samples=len(eval_ds), tokens=len(train_ds.tokens),
        loss_tokens=int(train_ds.mask.sum()), vocab_coverage=coverage, steps=trainer.step,
        final_loss=history[-1].loss if history else None, eval=final_eval, dropped=dropped,
        extra_evals={n: r for _, n, r in trainer.extra_evals},  # the last of each
        interrupted=trainer.interrupted,
    )
