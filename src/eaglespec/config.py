"""Typed, frozen configuration: every default has exactly one home, here.

`ModelConfig.from_hf(dict)` converts a Hugging Face `config.json` once; wrappers (multimodal models such as
Kimi-K2.5) keep their language model's fields under `text_config`, which is read transparently while the wrapper's own
`architectures` and the raw dict stay available. Architecture-specific groups (MLA, MoE, EAGLE-3) are optional
sub-dataclasses, so a model file only reads the groups it needs. A drafter in vLLM speculators' format (its layer under
`transformer_layer_config`) is rewritten as the EAGLE-3 layout by `speculators_config.from_speculators` first.

`RopeConfig` lives in `eaglespec.rope_config`, `MoEConfig` in `eaglespec.moe_config` (both importable from here
too). `SpecConfig` holds the speculative-decoding shape (steps S, topk K, draft tokens D) and `EngineConfig` the runtime
limits; `SamplingParams` (per request) lives in `eaglespec.sampling_params`, and the schedules of shapes by rows and
kind of step (`SpecSchedule`, `parse_spec`, `spec_text`) in `eaglespec.spec_schedule`, whose names this module also
answers to (`eaglespec.config.parse_spec`, as `eaglespec tune` prints it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .moe_config import MoEConfig  # re-exported: `from eaglespec.config import MoEConfig`
from .rope_config import RopeConfig  # noqa: F401 (re-exported: `from eaglespec.config import RopeConfig`)


@dataclass(frozen=True)
class MLAConfig:
    """DeepSeek multi-head latent attention."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Eagle3Config:
    """Fields only an EAGLE-3 drafter has."""

    draft_vocab_size: int | None  # None: the drafter uses the target vocabulary and the target's lm_head
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] | None  # None: the target's default capture layers
    # EAGLE-3.1's options (config.json, top level or in eagle_config; all False is EAGLE-3): an RMSNorm over the
    # concatenated aux states before fc (`norm_before_fc`, weight input_norm.weight [n_aux * Ht]) or one per aux
    # state (`fc_norm`, fc_norm.{i}.weight [Ht]; not both), and the final norm's output fed to the next draft step
    # instead of the pre-norm sum (`norm_output`)
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    # the layer's residual stream starts from hidden_norm(h), the attention's input half, instead of h (config.json top
    # level, as vLLM reads it; speculators' format states it on every drafter, speculators_config.py)
    norm_before_residual: bool = False
    # True: aux_layer_ids are in the protocol's convention already, because the checkpoint's format fixes its own
    # (speculators': vLLM's "after k layers", converted in speculators_config.py), so EngineConfig.aux_convention does
    # not apply to them
    aux_ids_fixed: bool = False


# model_type -> transformers' default `sliding_window_pattern` (every such layer global, the others windowed)
GLOBAL_EVERY = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4, "exaone4": 4}
# model_types whose transformers configs tie the head to the embedding unless they say otherwise
TIED_BY_DEFAULT = frozenset({"gemma2", "gemma3", "gemma3_text", "cohere", "cohere2", "ernie4_5", "ernie4_5_moe"})


def layer_windows(text: Mapping[str, Any], model_type: str, n_layers: int, window: int | None,
                  rope_layers: tuple[bool, ...] = ()) -> tuple[int | None, ...]:
    """Each layer's sliding window (or None), as transformers' configs assign them: `layer_types` when the config lists
    them (transformers 5 writes them: "sliding_attention" / "full_attention"); else Qwen2 / Qwen3's layers from
    `max_window_layers` on, Qwen2-MoE's even layers below it, Gemma 2's even ones, Gemma 3's and Cohere2's but every
    `sliding_window_pattern`-th, SmolLM3's NoPE layers (`rope_layers` false), and every layer of the others (Mistral,
    Mixtral, Qwen3-MoE, Phi-3). `()` without a window."""
    if window is None:
        return ()
    types = text.get("layer_types")
    if types:
        if len(types) != n_layers or not set(types) <= {"sliding_attention", "full_attention"}:
            raise ConfigError(f"layer_types must name 'sliding_attention' or 'full_attention' for each of the "
                              f"{n_layers} layers (got {list(types)})")
        return tuple(window if t == "sliding_attention" else None for t in types)
    if model_type == "smollm3":  # its NoPE layers
        return tuple(None if rope_layers and rope_layers[i] else window for i in range(n_layers))
    if model_type in GLOBAL_EVERY:  # released configs: every `sliding_window_pattern`-th layer is global
        pattern = text.get("sliding_window_pattern") or GLOBAL_EVERY[model_type]
        if isinstance(pattern, str):  # EXAONE 4's letters, "LLLG": L local, G global, repeated
            return tuple(None if pattern[i % len(pattern)] == "G" else window for i in range(n_layers))
        return tuple(window if (i + 1) % int(pattern) else None for i in range(n_layers))
    bound = int(text.get("max_window_layers", 28))  # transformers' default
    if model_type in ("qwen2", "qwen3"):
        return tuple(window if i >= bound else None for i in range(n_layers))
    if model_type == "qwen2_moe":
        return tuple(window if i % 2 == 0 and i < bound else None for i in range(n_layers))
    return (window,) * n_layers


def _ropes(text: Mapping[str, Any], model_type: str) -> tuple[RopeConfig, RopeConfig | None]:
    """(the full-attention layers' RoPE, the sliding-window layers' where it differs): transformers 5's
    rope_parameters keyed by layer type, or Gemma 3's released fields (rope_theta and rope_scaling for the global
    layers, rope_local_base_freq, default RoPE, for the local ones); else one RoPE (GLM-4's partial by default,
    MiniMax-M2's `rotary_dim` of `head_dim`)."""
    partial = 0.5 if model_type in ("glm4", "glm4_moe") else 1.0
    if text.get("rotary_dim") and text.get("head_dim"):  # MiniMax-M2's released configs name the rotated dims
        partial = int(text["rotary_dim"]) / int(text["head_dim"])
    by_type = text.get("rope_parameters") or {}
    if "full_attention" in by_type or "sliding_attention" in by_type:
        def one(kind: str) -> RopeConfig:
            return RopeConfig.from_hf({**text, "rope_scaling": None, "rope_parameters": by_type.get(kind) or {}},
                                      partial_default=partial)
        return one("full_attention"), one("sliding_attention")
    rope = RopeConfig.from_hf(text, partial_default=partial)
    if text.get("rope_local_base_freq") is not None:
        return rope, RopeConfig(theta=float(text["rope_local_base_freq"]))
    return rope, None


# Eagle3Config's EAGLE-3.1 fields, named as in config.json
EAGLE31_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    rope: RopeConfig = field(default_factory=RopeConfig)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str | None = None
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    eagle: Eagle3Config | None = None
    # the attention window of the windowed layers (Mistral-7B-v0.1's 4096; `sliding_window` unless
    # `use_sliding_window` is false, as Qwen2.5's configs carry a window they do not use); None: full attention
    sliding_window: int | None = None
    # per layer, its window (`sliding_window`) or None (full attention): `layer_windows` below
    layer_windows: tuple[int | None, ...] = ()
    # the RoPE of the sliding-window layers where it differs from `rope`, the full-attention layers' (Gemma 3's local
    # base frequency; transformers 5's rope_parameters keyed by layer type); None: `rope` everywhere
    rope_local: RopeConfig | None = None
    # per layer, whether it rotates q / k at all (SmolLM3's `no_rope_layers`: 0 for its NoPE layers); (): every layer
    rope_layers: tuple[bool, ...] = ()
    # The whole original dict (wrapper included): model files read extra groups such as vision_config from it.
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def text(self) -> Mapping[str, Any]:
        """The language model's own fields of the original dict: a wrapper's `text_config`, else the whole dict."""
        return self.raw.get("text_config") or self.raw

    @property
    def rotary_dim(self) -> int:
        """The dims of each head that RoPE rotates, the first ones (head_dim unless `rope.partial_rotary_factor` < 1:
        Phi-4-mini's 96 of 128, GLM-4's 64 of 128); the rest pass through unrotated."""
        return int(self.head_dim * self.rope.partial_rotary_factor)

    @property
    def context_limit(self) -> int:
        """The longest context the model runs at exactly: `max_position_embeddings`, or less where the model changes
        past a point this engine does not follow (`context_limit_reason`)."""
        return min([self.max_position_embeddings] + list(self._limits()))

    @property
    def context_limit_reason(self) -> str:
        """Why `context_limit` is below `max_position_embeddings` ("" when it is not)."""
        limit = self.context_limit
        return next((why for n, why in self._limits().items() if n == limit < self.max_position_embeddings), "")

    def _limits(self) -> dict[int, str]:
        out = {}
        if self.architecture == "DeepseekV32ForCausalLM" and self.text.get("index_topk"):  # within it, sparse = dense
            out[int(self.text["index_topk"])] = ("DeepSeek Sparse Attention's index_topk: past it the indexer chooses "
                                                 "the keys each query sees, which is not implemented")
        if self.rope.type == "longrope":  # its long factors apply to a whole sequence past the original positions
            out[self.rope.original_max_position_embeddings] = (
                "LongRoPE's original positions: its long factors, which change every position's rotation once a "
                "sequence is longer, are not implemented")
        return out

    def uses_rope(self, layer_idx: int) -> bool:
        """Whether the 0-based layer `layer_idx` applies RoPE (False: a NoPE layer, positions only through the mask)."""
        return self.rope_layers[layer_idx] if self.rope_layers else True

    def window_of(self, layer_idx: int) -> int | None:
        """The sliding window of the 0-based layer `layer_idx` (its queries see the keys less than that many positions
        behind them), or None for full attention."""
        return self.layer_windows[layer_idx] if self.layer_windows else None

    @staticmethod
    def from_hf(d: Mapping[str, Any]) -> "ModelConfig":
        """Convert a HF config dict (a wrapper's `text_config` is read for the language model fields)."""
        from .speculators_config import from_speculators, is_speculators

        if is_speculators(d):  # a drafter in vLLM speculators' format: read as its EAGLE-3 layout equivalent
            return from_speculators(d)
        archs = d.get("architectures") or []
        if not archs:
            raise ConfigError("config.json has no 'architectures' entry, so the model class cannot be chosen")
        text = dict(d.get("text_config") or d)
        try:
            hidden = int(text["hidden_size"])
            heads = int(text["num_attention_heads"])
            n_layers = int(text["num_hidden_layers"])
            vocab = int(text["vocab_size"])
        except KeyError as e:
            raise ConfigError(f"config.json lacks the field {e.args[0]!r}") from None
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or hidden // heads)
        eos = text.get("eos_token_id", d.get("eos_token_id"))
        eos_ids = tuple(int(x) for x in (eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []))
        mla = None
        if "kv_lora_rank" in text:
            mla = MLAConfig(
                q_lora_rank=text.get("q_lora_rank"),
                kv_lora_rank=int(text["kv_lora_rank"]),
                qk_nope_head_dim=int(text["qk_nope_head_dim"]),
                qk_rope_head_dim=int(text["qk_rope_head_dim"]),
                v_head_dim=int(text["v_head_dim"]),
            )
        model_type = str(text.get("model_type") or d.get("model_type") or "")
        window = int(text["sliding_window"]) if text.get("sliding_window") and text.get("use_sliding_window",
                                                                                      True) else None
        moe = MoEConfig.from_hf(text, model_type)
        rope, rope_local = _ropes(text, model_type)
        nope = text.get("no_rope_layers")
        # transformers' default, every no_rope_layer_interval-th layer NoPE: SmolLM3's without the list, Llama 4's
        # with it empty too (Scout's config.json holds `[]`)
        if (nope is None and model_type == "smollm3") or (not nope and model_type in ("llama4", "llama4_text")):
            every = int(text.get("no_rope_layer_interval") or 4)
            nope = [int((i + 1) % every != 0) for i in range(n_layers)]
        if nope is not None and len(nope) != n_layers:
            raise ConfigError(f"no_rope_layers has {len(nope)} entries for {n_layers} layers")
        rope_layers = tuple(bool(x) for x in nope) if nope is not None else ()
        windows = layer_windows(text, model_type, n_layers, window, rope_layers)
        if model_type in ("cohere2", "exaone4") and not rope_layers and any(windows):
            # Command R7B / A and EXAONE 4 with a window rotate their windowed layers only
            rope_layers = tuple(w is not None for w in windows)
        # the families whose transformers configs tie the head by default (Gemma, Cohere, ERNIE 4.5)
        tied = model_type in TIED_BY_DEFAULT
        # ERNIE 4.5's one switch for every projection's bias
        use_bias = bool(text.get("use_bias", False)) if model_type in ("ernie4_5", "ernie4_5_moe") else False
        eagle = None
        if any("eagle3" in a.lower() for a in archs):
            ec = text.get("eagle_config") or {}
            ids = ec.get("eagle_aux_hidden_state_layer_ids")
            draft_vocab = text.get("draft_vocab_size")

            def flag(name: str) -> bool:  # vLLM reads eagle_config's value first (NVIDIA's checkpoints), then the top
                return bool(ec[name] if ec.get(name) is not None else text.get(name, False))

            eagle = Eagle3Config(
                draft_vocab_size=int(draft_vocab) if draft_vocab else None,
                target_hidden_size=int(text.get("target_hidden_size") or hidden),
                aux_layer_ids=tuple(int(i) for i in ids) if ids else None,
                **{name: flag(name) for name in EAGLE31_FLAGS},
                norm_before_residual=bool(text.get("norm_before_residual", False)),
            )
            if eagle.norm_before_fc and eagle.fc_norm:
                raise ConfigError("the drafter's config sets both norm_before_fc (one RMSNorm over the concatenated "
                                  "aux states) and fc_norm (one per aux state): they are alternatives")
        cfg = ModelConfig(
            architecture=archs[0],
            model_type=str(d.get("model_type", "")),
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(text.get("intermediate_size") or 4 * hidden),
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", d.get("tie_word_embeddings", tied))),
            attention_bias=bool(text.get("attention_bias", text.get("bias", use_bias))),
            mlp_bias=bool(text.get("mlp_bias", use_bias)),
            hidden_act=str(text.get("hidden_act", "silu")),
            rope=rope,
            bos_token_id=text.get("bos_token_id", d.get("bos_token_id")),
            eos_token_ids=eos_ids,
            pad_token_id=text.get("pad_token_id", d.get("pad_token_id")),
            torch_dtype=text.get("torch_dtype", text.get("dtype", d.get("torch_dtype"))),
            mla=mla,
            moe=moe,
            eagle=eagle,
            sliding_window=window,
            layer_windows=windows,
            rope_local=rope_local,
            rope_layers=rope_layers,
            raw=dict(d),
        )
        if not 0 < cfg.rotary_dim <= head_dim or cfg.rotary_dim % 2:
            raise ConfigError(f"partial_rotary_factor {rope.partial_rotary_factor} of head_dim {head_dim} gives "
                              f"{cfg.rotary_dim} rotated dims: RoPE needs an even number between 2 and head_dim")
        return cfg

    @staticmethod
    def from_file(path: str | Path) -> "ModelConfig":
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{p} does not exist") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p} is not valid JSON ({e.msg} at line {e.lineno})") from None
        return ModelConfig.from_hf(d)

    def with_(self, **kw: Any) -> "ModelConfig":
        return replace(self, **kw)

    def default_aux_layer_ids(self) -> tuple[int, ...]:
        """EAGLE-3 default capture layers `[1, N//2 - 1, N - 4]` (outputs of these 0-based layers)."""
        n = self.num_hidden_layers
        ids = (1, n // 2 - 1, n - 4)
        return tuple(min(max(i, 0), n - 1) for i in ids)


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding shape: S draft steps, K branches per node, D verified tokens (root included)."""

    steps: int = 5
    topk: int = 4
    draft_tokens: int = 16

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"--steps must be >= 1 (got {self.steps})")
        if self.topk < 1:
            raise ConfigError(f"--topk must be >= 1 (got {self.topk})")
        hi = 1 + self.steps * self.topk
        if not 1 <= self.draft_tokens <= hi:
            raise ConfigError(
                f"--draft-tokens must be between 1 and 1 + steps*topk = {hi} (got {self.draft_tokens})"
            )

    @property
    def max_accept(self) -> int:
        """Most tokens one verification can commit (accepted drafts plus the bonus)."""
        return min(self.steps, self.draft_tokens - 1) + 1

    @staticmethod
    def chain(steps: int) -> "SpecConfig":
        return SpecConfig(steps=steps, topk=1, draft_tokens=steps + 1)


def parse_ints(text: str, what: str) -> list[int]:
    """ "1,8,32" -> [1, 8, 32] for the option `what` (spaces ignored); a one-sentence ConfigError otherwise."""
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers (got {text!r})") from None
    if not vals:
        raise ConfigError(f"{what} is empty")
    return vals


@dataclass(frozen=True)
class EngineConfig:
    """Runtime limits and placement."""

    device: str = "auto"  # auto, cpu, cuda, cuda:N
    dtype: str = "auto"  # auto, float32, bfloat16, float16
    max_batch_size: int = 8
    max_seq_len: int | None = None  # None: the model's context, capped for memory
    seed: int = 0
    # Capture convention for aux layer ids: "sglang" (id i = output of layer i) or "vllm" (id k = after k layers,
    # i.e. the output of layer k-1). A drafter whose format fixes its convention (speculators': vLLM's) is read by
    # that whatever this says (Eagle3Config.aux_ids_fixed).
    aux_convention: str = "sglang"
    cuda_graphs: bool = True
    prefill_graphs: bool = True  # with cuda_graphs: a single prompt of <= 2048 tokens prefills as a graph per bucket
    fuse_projections: bool | None = None  # None: on CUDA and the CPU (q/k/v and gate/up as one GEMM each)
    compile: bool | None = None  # torch.compile RMSNorm, RoPE, SiLU gating (fewer kernels); None: on CUDA only,
    #                              where Triton kernels take all but RoPE outside the RoPE + KV-store kernel (MLA)
    # Decode and speculative steps through the graph path launch step n+1 before reading step n's results, so the
    # host's bookkeeping overlaps the GPU's work (what step n+1 computed for a request finished at step n is dropped).
    # On by default: SmolLM2 bf16 on the H200, batch 1, 919 -> 993 tok/s (docs/benchmarks.md); no effect off the graph
    # path (the CPU). Sampled outputs keep their distribution, but the dropped steps also draw random numbers, so a
    # seeded run with overlap draws other samples than the same run without it.
    overlap: bool = True
    # With a drafter: speculate only while at most this many rows run (None: always). Busier steps decode plainly and
    # keep the drafter in step (a one-token catch-up on the decoded token), so speculation resumes when load falls:
    # a speculative step pays at small batches and costs more than it saves once the step is compute-bound.
    spec_max_rows: int | None = None
    # Admit waiting requests once this many rows are free (or all waiting fit, or nothing runs): 1 = at once, the
    # lowest latency; throughput jobs (regeneration) batch their prefills with larger values (engine/scheduler.py).
    min_prefill_rows: int = 1
    # An admission also prefills up to this many more waiting requests into spare cache rows; each takes a running
    # row when one frees, by a copy of its caches, without a prefill of its own (engine/scheduler.py): fewer, larger
    # prefills without idle rows, at the memory of this many more rows. 0: off; None: the engine's choice
    # (`engine.AUTO_PREFILL_AHEAD` for overlapped graph engines of 8 rows or more, else off).
    prefill_ahead: int | None = None
    # Graph path: once nothing waits, requests in rows past the batch bucket of their count move into free rows below
    # it (at a read, with no step in flight), so a run's drain replays smaller graphs (engine.py, `_compact_rows`).
    # No effect off the graph path. On by default: SmolLM2 bf16 on the H200, MT-bench continuous, two A B B A calls,
    # speculative +3.9% at 32 rows (44.2K -> 45.9K tok/s) and +1.3% at 8, plain +1.5% / +1.1% (docs/benchmarks.md,
    # "Session 31").
    compact_rows: bool = True
    # Log-probabilities for requests that ask (SamplingParams.logprobs): at most this many alternatives per token;
    # None: none. Computed only in steps where some running request asked for them (graphs keyed by it), so an
    # engine whose requests never ask pays nothing.
    max_logprobs: int | None = 20
    # A finished request's row keeps its cache entries until another request takes it, and a prompt that starts with
    # the tokens they were computed for is admitted there and prefills only the rest (engine/scheduler.py: a chat's
    # next turn, prompts sharing a system prompt). On the eager path only (the CPU, `cuda_graphs=False`): graph steps
    # overwrite free rows (`ModelRunner.keeps_free_rows`). None: where it measured faster (`assets.reuses_prefixes`:
    # the CPU).
    reuse_prefixes: bool | None = None
    # A prompt with more tokens than this to prefill runs in windows of this many (each attending to the ones before
    # it through the cache), then its last window with the batch's other prompts: the attention masks and activations
    # of a prefill stay those of this many tokens whatever the prompt's length (a 128K-token prompt's whole-prompt
    # mask alone would be 16 GB). None: whole prompts. Prompts with images prefill whole.
    prefill_chunk: int | None = 8192
    # "q4": on the CPU, a GGUF target's quantized projections (Q4_0 / Q4_1 / Q4_K / IQ3_S as one 4-bit product; Q5_0 /
    # Q5_1 / Q5_K / Q8_0 / Q3_K / IQ4_NL / IQ4_XS as two, Q2_K as three, Q6_K as four) multiplied as stored, with bf16
    # activations and row-invariant attention, so that speculation stays lossless in bf16 (engine/int4_weights.py);
    # "dense": weights dequantized to the engine's dtype; "auto": q4 where it is the measured default and the target's
    # weights allow it, else dense (`int4_weights.int4_mode`, engine/target_load.py)
    cpu_weights: str = "auto"

    def __post_init__(self) -> None:
        from .layers.logprobs import MAX_TOP_LOGPROBS

        if self.max_logprobs is not None and not 0 <= self.max_logprobs <= MAX_TOP_LOGPROBS:
            raise ConfigError(f"max_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, or None (got "
                              f"{self.max_logprobs})")
        if self.aux_convention not in ("sglang", "vllm"):
            raise ConfigError(f"aux convention must be 'sglang' or 'vllm' (got {self.aux_convention!r})")
        if self.spec_max_rows is not None and self.spec_max_rows < 1:
            raise ConfigError(f"spec_max_rows must be >= 1 or None (got {self.spec_max_rows}); --no-spec never "
                              "speculates")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"--dtype must be auto, float32, bfloat16 or float16 (got {self.dtype!r})")
        if self.cpu_weights not in ("auto", "dense", "q4"):
            raise ConfigError(f"--cpu-weights must be auto, dense or q4 (got {self.cpu_weights!r})")
        if self.cpu_weights == "q4" and self.dtype not in ("auto", "bfloat16"):
            raise ConfigError(f"--cpu-weights q4 computes in bfloat16 (the 4-bit kernel's activations); not with "
                              f"--dtype {self.dtype}")
        if self.cpu_weights == "q4" and self.compile:
            raise ConfigError("--cpu-weights q4 runs eager: compiled elementwise chains are not row-invariant (their "
                              "code differs by shape, so speculation would no longer give plain decoding's tokens)")
        if self.cpu_weights == "q4" and self.device not in ("auto", "cpu"):
            raise ConfigError(f"--cpu-weights q4 runs on the CPU; not with --device {self.device}")
        if self.prefill_chunk is not None and self.prefill_chunk < 16:
            raise ConfigError(f"prefill_chunk must be >= 16 tokens, or None (got {self.prefill_chunk})")
        if self.max_batch_size < 1:
            raise ConfigError(f"max batch size must be >= 1 (got {self.max_batch_size})")
        if self.min_prefill_rows < 1:
            raise ConfigError(f"min_prefill_rows must be >= 1 (got {self.min_prefill_rows})")
        if self.prefill_ahead is not None and self.prefill_ahead < 0:
            raise ConfigError(f"prefill_ahead must be >= 0 (got {self.prefill_ahead})")


_SCHEDULE_NAMES = frozenset({"ALL_ROWS", "Entries", "SpecSchedule", "format_spec", "parse_spec", "spec_envelope",
                             "spec_text"})


def __getattr__(name: str) -> Any:
    """The speculation schedule's names at their earlier home (spec_schedule.py imports this module: no cycle at
    import time)."""
    if name in _SCHEDULE_NAMES:
        from . import spec_schedule

        return getattr(spec_schedule, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
