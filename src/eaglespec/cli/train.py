"""`eaglespec train --target MODEL --data FILE --out DIR`: train an EAGLE-3 drafter for a target and export it.

Reads ShareGPT JSON / OpenAI `messages` JSONL (train/conversations.py), regenerates the assistant turns with the
target (cached under --work-dir, resumable), builds the draft vocabulary, trains with the training-time test on one
device and writes the published drafter format to --out (config.json + safetensors), loadable with
`eaglespec generate --model MODEL --draft DIR`, SGLang and vLLM. The recipe and its choices: docs/training.md.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an EAGLE-3 drafter for a target model",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default=None, help="HF model folder or .gguf (default: embedded SmolLM2-135M)")
    p.add_argument("--data", action="append", required=True, metavar="FILE",
                   help="conversations: ShareGPT JSON or OpenAI messages JSONL (repeatable)")
    p.add_argument("--out", required=True, help="folder for the exported drafter")
    p.add_argument("--work-dir", default=None,
                   help="regeneration cache, checkpoints and train_log.jsonl (default: OUT-work)")
    p.add_argument("--max-conversations", type=int, default=None, help="read at most this many conversations")
    d = p.add_argument_group("data")
    d.add_argument("--max-len", type=int, default=2048, help="tokens per sample (also caps regeneration)")
    d.add_argument("--long", choices=["truncate", "drop"], default="truncate", help="samples over --max-len")
    d.add_argument("--regenerate", action=argparse.BooleanOptionalAction, default=True,
                   help="replace the assistant turns by the target's own answers")
    d.add_argument("--first-turn-only", action="store_true",
                   help="regenerate and keep only the first exchange of each conversation (default: turn by turn)")
    d.add_argument("--regen-temperature", type=float, default=0.0, help="0 = greedy")
    d.add_argument("--regen-max-new-tokens", type=int, default=512, help="new tokens per regenerated turn")
    d.add_argument("--regen-batch", type=int, default=256, help="sequences decoded together")
    d.add_argument("--regen-stop-loop", type=int, default=0, metavar="N",
                   help="end a regenerated answer where it goes deeper than N tokens into a repetition loop (with "
                        "--loop-keep N those tokens carry no loss; a small target's greedy answers loop a lot); "
                        "0: off (default)")
    d.add_argument("--regen-shard", type=int, default=1024, help="conversations per cache shard")
    d.add_argument("--regen-cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="decode through the engine's CUDA graphs when regenerating on a GPU")
    d.add_argument("--self-prompts", type=int, action="append", default=None, metavar="N",
                   help="add N user prompts written by the target itself (sampled from its chat template's user "
                        "turn; cached), answered like the data: widens the tasks beyond the data files. Repeatable: "
                        "each --self-prompts is a set of its own, steered by the --self-prompt-openers given in the "
                        "same position (one per set, or none for free prompts), with its own cache")
    d.add_argument("--self-prompt-temperature", type=float, default=1.0, help="sampling temperature of those prompts")
    d.add_argument("--self-prompt-answer-temperature", type=float, default=None, metavar="T",
                   help="the temperature their answers are regenerated at (default: --regen-temperature's), e.g. 1 "
                        "beside a greedy --regen-temperature 0: a drafter trained on both greedy and sampled text")
    d.add_argument("--self-prompt-top-p", type=float, default=0.95, help="nucleus of those prompts")
    d.add_argument("--self-prompt-openers", action="append", default=None, metavar="W1,W2,...",
                   help="comma-separated words those prompts start with, cycled (e.g. Write,Solve,Imagine you are): "
                        "steers the target towards task types (default: free prompts); repeatable, one per "
                        "--self-prompts")
    d.add_argument("--eval-frac", type=float, default=0.02, help="held-out fraction for evaluation")
    d.add_argument("--eval-seed", type=int, default=0,
                   help="the seed of the held-out split (apart from --seed: runs with other seeds, such as a drafter "
                        "continued with --init on new prompts, keep holding out the same prompts)")
    d.add_argument("--eval-prompts", default=None, metavar="mt-bench|FILE.jsonl",
                   help="also evaluate on these prompts answered by the target (mt-bench: its 80 first turns, shipped "
                        "with eaglespec), beside the held-out split: the benchmark's view during training; it never "
                        "chooses the exported weights")
    d.add_argument("--loop-keep", type=int, default=None, metavar="N",
                   help="no loss on answer tokens deeper than N tokens into a repetition loop (each completing an "
                        "8-gram seen before): for small targets whose greedy answers loop (default: off)")
    m = p.add_argument_group("drafter")
    m.add_argument("--draft-vocab", type=int, default=32000, help="draft vocabulary size (0 = the full vocabulary)")
    m.add_argument("--init", default=None, metavar="DRAFTER_DIR",
                   help="continue training an exported drafter (keeps its vocabulary and aux layers)")
    m.add_argument("--rebuild-vocab", action="store_true",
                   help="with --init: build a draft vocabulary of --draft-vocab tokens from this data and move the "
                        "drafter onto it (rows of tokens in both keep their training)")
    m.add_argument("--drafter-intermediate-size", type=int, default=None, metavar="N",
                   help="the drafter layer's MLP width (default: the target layer's; with --init: widens that drafter)")
    m.add_argument("--drafter-heads", type=int, default=None, metavar="N",
                   help="the drafter layer's query heads, a multiple of the target's KV heads (default: the target's; "
                        "with --init: adds heads to that drafter)")
    m.add_argument("--drafter-layers", type=int, default=None, metavar="N",
                   help="decoder layers (default 1, the published EAGLE-3 drafter; more: vLLM's and speculators' "
                        "multi-layer EAGLE-3, which SGLang does not run; with --init: adds layers that start as the "
                        "identity)")
    m.add_argument("--norm-before-fc", action="store_true", default=None,
                   help="EAGLE-3.1: an RMSNorm over the concatenated aux states before fc (with --init: added)")
    m.add_argument("--fc-norm", action="store_true", default=None,
                   help="EAGLE-3.1: an RMSNorm per aux state before fc (the alternative to --norm-before-fc)")
    m.add_argument("--norm-output", action="store_true", default=None,
                   help="EAGLE-3.1: the next draft step takes the final norm's output instead of the pre-norm sum")
    m.add_argument("--aux-layers", default=None, metavar="I,J,K",
                   help="target layers whose outputs feed the drafter (default [1, N//2-1, N-4], SGLang convention)")
    t = p.add_argument_group("training")
    t.add_argument("--ttt-steps", type=int, default=7, help="unrolled training-time-test steps")
    t.add_argument("--step-decay", type=float, default=0.8, help="loss weight of step k is decay**k")
    t.add_argument("--ttt-align", type=int, default=0, metavar="K",
                   help="a step's loss only where every earlier step ranked the target's token in its top K, the "
                        "states drafting reaches (1: a chain's; 0: every position, as published); the progress "
                        "bar's accuracies then count those positions only, evaluations every position")
    t.add_argument("--label-sharpen", type=float, default=1.0, metavar="A",
                   help="train against the target's distribution sharpened, p^A renormalised (its argmax unchanged: "
                        "greedy verification accepts only it); 1: p itself, as published. A greedy lever: a sampled "
                        "chain's acceptance wants the drafter's distribution near the target's")
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--warmup-frac", type=float, default=0.015)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--grad-clip", type=float, default=0.5)
    t.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per batch")
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--max-steps", type=int, default=None, help="optimiser steps (overrides --epochs)")
    t.add_argument("--stop-after", type=int, default=None,
                   help="stop with a checkpoint after this many steps (same schedule; finish with --resume)")
    t.add_argument("--save-every", type=int, default=500, help="checkpoint every N steps")
    t.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N steps (0 = at the end); with --init also before the first step, as the "
                        "baseline the trained weights are compared with")
    t.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --work-dir")
    t.add_argument("--seed", type=int, default=0,
                   help="shuffling, the self-written prompts' draws and sampled regeneration (the held-out split has "
                        "--eval-seed)")
    t.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    t.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="the target's dtype (auto: bf16 on GPU, with bf16 autocast for the drafter; fp32 on CPU)")
    t.add_argument("--feature-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="on a GPU, replay the target's forward over each batch shape as a CUDA graph (the same "
                        "features; a memory pool the size of the largest batch's forward stays reserved: "
                        "--no-feature-graphs frees it for the drafter when memory is short)")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    e = p.add_argument_group("export")
    e.add_argument("--export-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    e.add_argument("--export-last", action="store_true",
                   help="export the last weights, not those of the best held-out evaluation (see --eval-every)")
    e.add_argument("--max-shard-mb", type=float, default=None,
                   help="split the weights into safetensors files of at most this many MiB")


def _aux_layers(spec: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    if spec is None:
        return default
    try:
        return tuple(int(x) for x in spec.replace(" ", "").split(",") if x)
    except ValueError:
        raise ConfigError(f"--aux-layers must be comma-separated integers (got {spec!r})") from None


def _prompt_sets(counts: list[int], openers: list[str]) -> list[tuple[int, tuple[str, ...]]]:
    """The --self-prompts sets as (n, openers), sets of 0 prompts left out; checks the pairing."""
    bad = [n for n in counts if n < 0]
    if bad:
        raise ConfigError(f"--self-prompts must be >= 0 (got {bad[0]})")
    if openers and not counts:
        raise ConfigError("--self-prompt-openers steers --self-prompts, which is not given")
    if openers and len(openers) != len(counts):
        raise ConfigError(f"give one --self-prompt-openers per --self-prompts, in the same order (got {len(openers)} "
                          f"for {len(counts)} sets; an empty string means free prompts)")
    words = [tuple(w.strip() for w in o.split(",") if w.strip()) for o in openers] or [()] * len(counts)
    sets = [(n, w) for n, w in zip(counts, words) if n > 0]
    seen: dict[tuple[str, ...], int] = {}
    for i, (_, w) in enumerate(sets):
        if w in seen:
            raise ConfigError(f"--self-prompts sets {seen[w] + 1} and {i + 1} have the same openers "
                              f"({','.join(w) or 'none'}): they would write the same prompts; give one set with "
                              "the sum of their sizes")
        seen[w] = i
    return sets


def run(args: argparse.Namespace) -> int:
    import torch

    from ..engine.transforms import prepare_for_inference
    from ..loading.checkpoint import load_model, resolve_device
    from ..sampling_params import SamplingParams
    from ..train.conversations import read_conversations
    from ..train.drafter import DrafterShape
    from ..train.export import export_dtype
    from ..train.pipeline import PipelineOptions, train_drafter
    from ..train.regenerate import RegenConfig
    from ..train.self_prompts import SelfPromptConfig
    from ..train.trainer import TrainConfig

    if args.max_len < 8:
        raise ConfigError(f"--max-len must be >= 8 (got {args.max_len})")
    if args.loop_keep is not None and args.loop_keep < 0:
        raise ConfigError(f"--loop-keep must be >= 0 (got {args.loop_keep})")
    if args.regen_stop_loop < 0:
        raise ConfigError(f"--regen-stop-loop must be >= 0 (got {args.regen_stop_loop})")
    if args.regen_stop_loop and not args.regenerate:
        raise ConfigError("--regen-stop-loop ends regenerated answers, and --no-regenerate regenerates none")
    if not 0 <= args.eval_frac < 1:
        raise ConfigError(f"--eval-frac must be in [0, 1) (got {args.eval_frac})")
    prompt_sets = _prompt_sets(args.self_prompts or [], args.self_prompt_openers or [])
    if prompt_sets and not args.regenerate:
        raise ConfigError("--self-prompts needs regeneration: the target's prompts have no answers until it writes "
                          "them (drop --no-regenerate)")
    if args.eval_prompts:
        from ..train.pipeline import prompt_set_conversations

        # --no-regenerate, or a missing or malformed file, fails before the model load
        prompt_set_conversations(args.eval_prompts, args.regenerate)
    work_dir = args.work_dir or str(args.out).rstrip("/") + "-work"
    if args.regenerate:
        SamplingParams(temperature=args.regen_temperature)  # a bad value fails here, not after the model load
    if prompt_sets:
        SamplingParams(temperature=args.self_prompt_temperature, top_p=args.self_prompt_top_p)
    if args.self_prompt_answer_temperature is not None:
        if not prompt_sets:
            raise ConfigError("--self-prompt-answer-temperature sets how --self-prompts are answered, which is not "
                              "given")
        SamplingParams(temperature=args.self_prompt_answer_temperature)
    training = dict(  # TrainConfig's settings but the aux layers (the target's): checked now, before the model load
        ttt_steps=args.ttt_steps, step_decay=args.step_decay, ttt_align=args.ttt_align,
        label_sharpen=args.label_sharpen, lr=args.lr, warmup_frac=args.warmup_frac,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip, batch_tokens=args.batch_tokens,
        epochs=args.epochs, max_steps=args.max_steps, stop_after=args.stop_after, eval_every=args.eval_every,
        save_every=args.save_every, seed=args.seed, resume=args.resume, progress=not args.no_progress,
        amp=args.dtype != "float32",  # --dtype float32 on a GPU trains without bf16 autocast
        eval_at_start=bool(args.init) and args.eval_every > 0,  # a continued drafter's starting point, in the log
        feature_graphs=args.feature_graphs,
    )
    TrainConfig(work_dir=work_dir, aux_layers=(), **training)
    convs = read_conversations(args.data, args.max_conversations)  # data errors before the model load
    if args.first_turn_only and not args.regenerate:
        convs.conversations = [c[: next(i for i, m in enumerate(c) if m["role"] == "assistant") + 1]
                               for c in convs.conversations]
    print(f"read {convs.summary()}", file=sys.stderr)
    device = resolve_device(args.device)
    dtype = None if args.dtype == "auto" else args.dtype
    if dtype is None and device.type == "cuda":
        dtype = torch.bfloat16
    loaded = load_model(args.target, device=device, dtype=dtype)
    if loaded.tokenizer is None or not loaded.tokenizer.has_chat_template:
        raise ConfigError(f"{loaded.path} has no tokenizer with a chat template, which training needs")
    # The target is frozen: it regenerates and gives features in its inference form (on CUDA: fused projections,
    # the RoPE + KV-store kernel, compiled elementwise chains; on the CPU: fused, weight-major projections), as
    # `eaglespec generate` runs it.
    prepare_for_inference(loaded.model, device, None, None)
    tcfg = loaded.config
    shape = DrafterShape(intermediate_size=args.drafter_intermediate_size, num_attention_heads=args.drafter_heads,
                         num_hidden_layers=args.drafter_layers, norm_before_fc=args.norm_before_fc,
                         fc_norm=args.fc_norm, norm_output=args.norm_output)  # checked by train_drafter up front
    train_cfg = TrainConfig(work_dir=work_dir, aux_layers=_aux_layers(args.aux_layers, tcfg.default_aux_layer_ids()),
                            **training)
    regen = RegenConfig(temperature=args.regen_temperature, max_new_tokens=args.regen_max_new_tokens,
                        max_len=args.max_len, first_turn_only=args.first_turn_only, batch_size=args.regen_batch,
                        shard_size=args.regen_shard, seed=args.seed,
                        cuda_graphs=args.regen_cuda_graphs,
                        stop_loop=args.regen_stop_loop) if args.regenerate else None
    opts = PipelineOptions(
        train=train_cfg, regen=regen, max_len=args.max_len, long=args.long, draft_vocab=args.draft_vocab or None,
        eval_frac=args.eval_frac, eval_seed=args.eval_seed, export_dtype=export_dtype(args.export_dtype),
        max_shard_mb=args.max_shard_mb,
        target_name=str(loaded.path), init=args.init, rebuild_vocab=args.rebuild_vocab,
        export_best=not args.export_last, shape=shape, loop_keep=args.loop_keep,
        # a prompt may take half of --max-len (up to 256 tokens): the rest is its answer's
        self_prompts=tuple(SelfPromptConfig(n=n, temperature=args.self_prompt_temperature,
                                            top_p=args.self_prompt_top_p, max_new_tokens=min(256, args.max_len // 2),
                                            openers=words, batch_size=args.regen_batch, seed=args.seed,
                                            cuda_graphs=args.regen_cuda_graphs) for n, words in prompt_sets),
        eval_prompts=args.eval_prompts, self_prompt_answer_temperature=args.self_prompt_answer_temperature,
    )
    from ..engine.gc_heap import freeze_heap

    # the target, its tokenizer, the conversations and the libraries, out of the run's full garbage collections
    # (engine/gc_heap.py); not the regeneration's engines, built and dropped inside (a frozen one would never be freed)
    freeze_heap()
    summary = train_drafter(loaded.model, loaded.tokenizer, convs.conversations, args.out, opts)
    if summary.eval is not None:
        print(summary.eval.line(), file=sys.stderr)
    for name, res in summary.extra_evals.items():
        print(f"{name} {res.line()}", file=sys.stderr)
    # stopped by SIGINT / SIGTERM with a checkpoint: the shell's code for a process ended by that signal, so scripts
    # (and `timeout`) see that the run did not finish
    return 0 if summary.interrupted is None else 128 + summary.interrupted
