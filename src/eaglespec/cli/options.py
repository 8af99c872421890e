"""Options shared by the commands that load a model (generate, chat, serve, bench): one definition each."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..assets import default_drafter_path, slower_note
from ..config import EngineConfig, SpecConfig
from ..spec_schedule import SpecSchedule, parse_spec, spec_text
from ..errors import ConfigError
from ..grammar.output_format import StructuredOutput
from ..loading.default import is_default_model
from ..sampling_params import SamplingParams

if TYPE_CHECKING:
    from ..engine.engine import Engine


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model folder or .gguf file (default: embedded SmolLM2-135M)")
    p.add_argument("--draft", default="auto",
                   help="EAGLE-3 drafter folder (default: the shipped drafter for the embedded model)")
    p.add_argument("--no-spec", action="store_true", help="plain decoding, no speculation")
    p.add_argument("--spec", default=None, metavar="S,K,D",
                   help="the speculative shape as steps,topk,draft-tokens (e.g. 3,1,4), or a schedule by rows "
                        "ROWS:S,K,D/ROWS:S,K,D/... as `eaglespec tune` recommends (instead of --steps/--topk/"
                        "--draft-tokens), either followed by ';sampled=' and the shape or schedule of steps that "
                        "sample and ';penalized=' that of steps under count penalties, each possibly 'plain' (e.g. "
                        "'1:3,1,4/8:4,4,8;sampled=3,1,4;penalized=plain'), or 'auto' (the default: the shapes "
                        "measured fastest on this device, greedy, sampled and penalized)")
    p.add_argument("--steps", type=int, default=None, help="draft depth S")
    p.add_argument("--topk", type=int, default=None, help="branching K (1 = chain)")
    p.add_argument("--draft-tokens", type=int, default=None, help="verified tokens D, root included")
    p.add_argument("--seed", type=int, default=0)
    add_runtime_options(p)


def add_runtime_options(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Placement and execution: device, dtype, the aux-layer convention, CUDA graphs and the inference transforms."""
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--cpu-weights", default="auto", choices=["auto", "dense", "q4"],
                   help="q4: on the CPU, multiply a GGUF's quantized weights (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0, "
                        "Q2_K to Q6_K, IQ3_S / IQ4_NL / IQ4_XS) as stored, as sums of 4-bit products in bfloat16 with "
                        "row-invariant attention (speculation still gives plain decoding's tokens); dense: weights "
                        "dequantized to --dtype; auto (default): q4 on an x86-64 CPU with --dtype auto where every "
                        "projection is such a weight, else dense")
    p.add_argument("--aux-convention", default="sglang", choices=["sglang", "vllm"],
                   help="how the drafter's eagle_aux_hidden_state_layer_ids are read (vllm: id k = after k layers; "
                        "a drafter in vLLM speculators' format is always read as vllm)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="replay decode and speculative steps as CUDA graphs (CUDA only)")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=None,
                   help="fuse q/k/v and gate/up projections (default: on CUDA and the CPU)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the elementwise chains (RMSNorm, RoPE, SiLU gating): fewer kernels per layer "
                        "(default: on CUDA only, where Triton kernels already serve all but RoPE outside the fused "
                        "RoPE + KV-store kernel, so a GQA model compiles nothing)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="with CUDA graphs: launch each decode or speculative step before reading the previous one's "
                        "results, so the host's work overlaps the GPU's (default: on)")
    p.add_argument("--spec-max-rows", type=int, default=None, metavar="N",
                   help="speculate only while at most N requests run; busier steps decode plainly and keep the "
                        "drafter in step (default: always speculate)")
    p.add_argument("--min-prefill-rows", type=int, default=1, metavar="N",
                   help="admit waiting requests once N rows are free (or all waiting fit, or nothing runs): fewer, "
                        "larger prefills for throughput, later first tokens (default: 1, at once)")
    p.add_argument("--prefill-ahead", type=int, default=None, metavar="N",
                   help="an admission also prefills up to N more waiting requests into spare cache rows, each "
                        "taking a running row when one frees, without a prefill of its own: fewer prefills that "
                        "pause the running rows (0: off; default: 4 on CUDA graph engines of 8 rows or more)")
    p.add_argument("--compact-rows", action=argparse.BooleanOptionalAction, default=True,
                   help="CUDA graphs: once nothing waits, move running requests into the lowest rows so that the "
                        "drain of a batch replays smaller graphs (default: on; --no-compact-rows: off)")


def add_sampling_options(p: argparse.ArgumentParser, max_new_tokens: int = 256) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_adjustment_options(p)
    add_structured_options(p)


def add_structured_options(p: argparse.ArgumentParser) -> None:
    """A structured output (grammar/output_format.py): at most one of these."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="SCHEMA", help="the answer is JSON of this schema (JSON text or a file)")
    g.add_argument("--json-object", action="store_true", help="the answer is a JSON object")
    g.add_argument("--regex", help="the answer matches this regular expression")
    g.add_argument("--choice", action="append", metavar="TEXT", help="the answer is one of these (repeatable)")
    g.add_argument("--grammar", metavar="GRAMMAR", help="the answer follows this Lark or GBNF grammar (text or a file)")


def structured_output(args: argparse.Namespace) -> StructuredOutput | None:
    """`add_structured_options`' value (a schema or grammar naming an existing file is read from it)."""
    def text(value: str) -> str:
        path = Path(value)
        return path.read_text() if len(value) < 4096 and "\n" not in value and path.is_file() else value

    if args.json_schema is not None:
        return StructuredOutput.json_schema(text(args.json_schema))
    if args.json_object:
        return StructuredOutput("json_object")
    if args.regex is not None:
        return StructuredOutput("regex", args.regex)
    if args.choice:
        return StructuredOutput.choice(args.choice)
    if args.grammar is not None:
        return StructuredOutput("grammar", text(args.grammar))
    return None


def add_adjustment_options(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The logit adjustments (layers/logit_adjust.py) of generate, chat and bench."""
    p.add_argument("--min-p", type=float, default=0.0, help="sampling: drop tokens below min-p x the most likely one")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide the logits of tokens already in the prompt or the answer by it (1 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract it times a token's count in the answer from its logit (-2..2)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract it from the logit of every token already in the answer (-2..2)")


def adjustments(args: argparse.Namespace) -> dict[str, float]:
    """`add_adjustment_options`' values as SamplingParams keywords."""
    return dict(min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        stop=tuple(args.stop), ignore_eos=args.ignore_eos, **adjustments(args), structured=structured_output(args),
    )


def spec_config(args: argparse.Namespace) -> SpecConfig | SpecSchedule | None:
    """The speculative shape asked for: `--spec` (a shape or a schedule), or --steps/--topk/--draft-tokens, whose
    unset fields take SpecConfig's defaults (draft tokens <= 1 + S*K); None when neither is given (or `--spec auto`:
    the default policy)."""
    separate = args.steps is not None or args.topk is not None or args.draft_tokens is not None
    if args.spec is not None and args.spec.strip() != "auto":
        if separate:
            raise ConfigError("--spec and --steps/--topk/--draft-tokens exclude each other: give the shape one way")
        return parse_spec(args.spec)
    if not separate:
        return None
    d = SpecConfig()
    steps = args.steps if args.steps is not None else d.steps
    topk = args.topk if args.topk is not None else d.topk
    if args.draft_tokens is not None:
        tokens = args.draft_tokens
    else:
        tokens = min(d.draft_tokens, 1 + steps * topk)
    return SpecConfig(steps=steps, topk=topk, draft_tokens=tokens)


def device_arg(args: argparse.Namespace) -> str:
    """`--device`, where `auto` with `--cpu-weights q4` (a CPU path) means the CPU."""
    return "cpu" if args.cpu_weights == "q4" and args.device == "auto" else args.device


def engine_config(args: argparse.Namespace, **kw) -> EngineConfig:
    return EngineConfig(device=device_arg(args), dtype=args.dtype, seed=args.seed, aux_convention=args.aux_convention,
                        cuda_graphs=args.cuda_graphs, fuse_projections=args.fuse, compile=args.compile,
                        cpu_weights=args.cpu_weights,
                        overlap=args.overlap, spec_max_rows=args.spec_max_rows,
                        min_prefill_rows=args.min_prefill_rows, prefill_ahead=args.prefill_ahead,
                        compact_rows=args.compact_rows, **kw)


def draft_arg(args: argparse.Namespace) -> str | None:
    return None if args.no_spec else args.draft


def answer_line(tokens: int, seconds: float) -> str:
    """The start of the stats line `generate` and `chat` print after an answer."""
    return f"[eaglespec] {tokens} tokens in {seconds:.2f} s ({tokens / seconds if seconds > 0 else 0.0:.1f} tok/s)"


def plain_reason(engine: "Engine", args: argparse.Namespace) -> str | None:
    """Why an engine that `--draft auto` built for the embedded model decodes plainly (None where it speculates, or
    where the user chose the drafter or --no-spec)."""
    if engine.speculative or args.draft != "auto" or args.no_spec:
        return None
    if args.model is not None and not is_default_model(args.model):  # (its sha256 is cached from api.load)
        return None
    if default_drafter_path() is None:
        return "no speculation: this build ships no drafter for the embedded model (--draft DIR to use one)"
    kind = engine.device.type
    why = engine.plain_note or slower_note(kind)
    return (f"no speculation: the shipped drafter is slower than plain decoding on {kind} "
            f"({why}; --steps S --topk K speculates anyway)")


def device_text(engine: "Engine") -> str:
    """The engine's device type for start-up and stats lines, with "(4-bit CPU weights)" where the target runs the
    4-bit CPU path (engine/int4_weights.py: bf16 on the GGUF's own 4-bit weights, by default on one-row x86-64 CPU
    engines): the weights that answer are named wherever the speed is."""
    from ..engine.int4_weights import on_int4_path  # (loaded with the engine: not at the CLI's start)

    if on_int4_path(engine.runner.target):
        return f"{engine.device.type} (4-bit CPU weights)"
    return engine.device.type


def engine_summary(engine: "Engine", args: argparse.Namespace) -> str:
    """One phrase for start-up lines: the speculative shape, or plain decoding and why."""
    if engine.speculative:
        assert engine.schedule is not None
        text = f"speculative, --spec {spec_text(engine.schedule.single or engine.schedule)}"
        limit = engine.config.spec_max_rows
        if limit is not None and limit < engine.config.max_batch_size:
            text += (f" while at most {limit} request{'s' if limit > 1 else ''} run{'' if limit > 1 else 's'} "
                     "(plain decoding steps beyond)")
        return text
    return plain_reason(engine, args) or "plain decoding"
