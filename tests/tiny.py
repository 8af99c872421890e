"""Tiny random models and a character tokenizer for CPU tests (no downloads); `imports_compiler(code)`;
`graded_candidates` (a tree's drafted candidates with many equal scores); `per_expert`
(a transformers MoE state dict in checkpoint form), `randomize_moe` and `tiny_moe` (Qwen3-MoE and DeepSeek-V3
targets); `assert_transformed_engine_equals_plain` and `kernel_spy` (an engine's steps routed through kernels)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import torch

from eaglespec.config import ModelConfig
from eaglespec.layers.context import ForwardContext
from eaglespec.models.eagle3 import LlamaForCausalLMEagle3
from eaglespec.models.llama import LlamaForCausalLM


def _init(model: torch.nn.Module, std: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def imports_compiler(code: str, modules: tuple[str, ...] = ("torch._dynamo",)) -> bool:
    """Whether running `code` in a fresh interpreter (this module importable) imports torch._dynamo (or any of
    `modules`): start-up paths that must not pay for the compiler (or sympy, which PyTorch's meta-device references
    import) are checked there, since the test process has imported them long before."""
    prelude = f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
    tail = f"\nprint(any(m in sys.modules for m in {modules!r}))\n"
    out = subprocess.run([sys.executable, "-c", prelude + code + tail], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1] != "False"


def graded_candidates(B: int, K: int, S: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A tree drafting phase's candidates in spec/draft.py's level order (K depth-1 candidates, then K^2 children of
    K random frontier slots per level), with scores on a grid of 0.5, so that many are equal, and never above their
    parent's: (root [B], tokens [B, N], scores [B, N], parents [B, N], depth [B, N]; ids < 50), on the generator's
    device. The selection kernels are checked against the stable sort on them (tests and
    benchmarks/wide_tree_check.py)."""
    dev = generator.device
    N = K + (S - 1) * K * K
    parents = torch.empty(B, N, dtype=torch.int64, device=dev)
    scores = torch.empty(B, N, device=dev)
    depth = torch.empty(N, dtype=torch.int64, device=dev)
    parents[:, :K], depth[:K] = -1, 1
    scores[:, :K] = -torch.randint(0, 3, (B, K), generator=generator, device=dev).float() * 0.5
    base, frontier = K, torch.arange(K, device=dev).expand(B, K)
    for level in range(2, S + 1):
        par = frontier[:, :, None].expand(B, K, K).reshape(B, K * K)
        parents[:, base:base + K * K] = par
        depth[base:base + K * K] = level
        scores[:, base:base + K * K] = torch.gather(scores, 1, par) - torch.randint(
            0, 2, (B, K * K), generator=generator, device=dev).float() * 0.5
        frontier = base + torch.randint(0, K * K, (B, K), generator=generator, device=dev)
        base += K * K
    tokens = torch.randint(0, 50, (B, N), generator=generator, device=dev)
    root = torch.randint(0, 50, (B,), generator=generator, device=dev)
    return root, tokens, scores, parents, depth.expand(B, N)


def llama_config(vocab: int = 97, layers: int = 6, hidden: int = 64, tie: bool = False, **kw) -> ModelConfig:
    d = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab, hidden_size=hidden,
        intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=tie, eos_token_id=kw.pop("eos_token_id", None),
    )
    d.update(kw)
    return ModelConfig.from_hf(d)


def tiny_llama(seed: int = 0, std: float = 0.2, **kw) -> LlamaForCausalLM:
    """A random Llama whose greedy output varies (std 0.2 keeps logits peaky but not constant)."""
    m = LlamaForCausalLM(llama_config(**kw)).eval()
    _init(m, std, seed)
    return m


def drafter_config(target: ModelConfig, draft_vocab: int | None = 50, hidden: int = 64, **kw) -> ModelConfig:
    d = dict(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=target.vocab_size,
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, target_hidden_size=target.hidden_size,
        tie_word_embeddings=False,
    )
    if draft_vocab is not None:
        d["draft_vocab_size"] = draft_vocab
    d.update(kw)
    return ModelConfig.from_hf(d)


def tiny_drafter(target: LlamaForCausalLM, seed: int = 1, draft_vocab: int | None = 50, std: float = 0.2,
                 **kw) -> LlamaForCausalLMEagle3:
    cfg = drafter_config(target.config, draft_vocab, **kw)
    m = LlamaForCausalLMEagle3(cfg).eval()
    _init(m, std, seed)
    if draft_vocab is not None:
        g = torch.Generator().manual_seed(seed)
        keep = torch.randperm(target.config.vocab_size, generator=g)[:draft_vocab].sort().values
        m.d2t.copy_(keep - torch.arange(draft_vocab))
        m.t2d.zero_()
        m.t2d[keep] = True
    return m


class CharTokenizer:
    """id i <-> one printable character; enough for stop-string tests."""

    alphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?-+*/=()[]{}<>@#$%^&_~'\"|\\`\n\t"

    def __init__(self, vocab: int, eos: int | None = None) -> None:
        self.vocab_size = vocab
        self.eos_token_ids = (eos,) if eos is not None else ()
        self.bos_token_id = None
        self.pad_token_id = None
        self.has_chat_template = False

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.alphabet[i % len(self.alphabet)] for i in ids
                       if not (skip_special_tokens and i in self.eos_token_ids))


def assert_transformed_engine_equals_plain(prepare, spec, prompts, max_new_tokens: int,
                                           drafter_kw: dict | None = None,
                                           target: torch.nn.Module | None = None) -> None:
    """Greedy tokens of a tiny target (`target`, else `tiny_llama(seed=0)`) decoding plainly; then `prepare(target,
    drafter)` (inference transforms, kernel hooks) on that target and a tiny drafter (config fields `drafter_kw`):
    plain decoding and speculation with `spec` still give those tokens."""
    from eaglespec.engine.engine import Engine
    from eaglespec.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    target = tiny_llama(seed=0) if target is None else target
    ref = [o.token_ids for o in Engine(target, None).generate(prompts, params)]
    drafter = tiny_drafter(target, seed=1, **(drafter_kw or {}))
    prepare(target, drafter)
    assert [o.token_ids for o in Engine(target, None).generate(prompts, params)] == ref
    eng = Engine(target, None, drafter=drafter, spec=spec)
    assert [o.token_ids for o in eng.generate(prompts, params)] == ref


def kernel_spy(calls: list, fn, label):
    """`fn` forced onto its Triton kernel (`kernel=True`; the interpreter on the CPU), appending `label` to `calls` at
    each call (label: a value, or a function of the call's positional arguments that gives it), for hooks that
    route an engine's steps through kernels (`assert_transformed_engine_equals_plain`)."""
    def spy(*a, **kw):
        calls.append(label(a) if callable(label) else label)
        return fn(*a, **kw, kernel=True)

    return spy


def assert_speculation_equals_plain(target, drafter, prompts, params, specs) -> list[list[int]]:
    """Greedy tokens of `target` decoding `prompts` plainly in one batch; speculation with `drafter` and each shape of
    `specs` gives the same tokens (and verifies drafts). Returns the plain tokens."""
    from eaglespec.config import EngineConfig
    from eaglespec.engine.engine import Engine

    cfg = EngineConfig(max_batch_size=len(prompts))
    plain = [o.token_ids for o in Engine(target, None, cfg).generate(prompts, params)]
    for spec in specs:
        eng = Engine(target, None, cfg, drafter=drafter, spec=spec)
        assert [o.token_ids for o in eng.generate(prompts, params)] == plain and eng.stats.verify_steps > 0
    return plain


def per_expert(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers 5 MoE state dict in checkpoint form: transformers fuses the experts in memory ([E, 2I, H]
    gate|up, [E, H, I] down); checkpoints (and its save_pretrained) keep one tensor per expert, our models' names."""
    out = {}
    for k, v in hf_state.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base, half = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :half]
                out[f"{base}{e}.up_proj.weight"] = v[e, half:]
        elif k.endswith("mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                out[f"{k[: -len('down_proj')]}{e}.down_proj.weight"] = v[e]
        else:
            out[k] = v
    return out


def randomize_moe(model: torch.nn.Module, seed: int) -> None:
    """Weights for a tiny MoE test model (transformers' or ours): O(1) logits and routing that depends on the inputs
    (transformers' init, std 0.02, routes near-uniformly); gain 2, so that greedy decoding does not fall into a loop
    of two or three tokens at once."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if t.dim() == 1:  # norm weights and biases
                t.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.1 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(2.0 * torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))


def tiny_moe(arch: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random MoE target (`randomize_moe`'s weights): "qwen3_moe", "qwen2_moe" (a gated shared expert),
    "mixtral", "gpt_oss" (clamped-SwiGLU experts with biases, a biased router, sinks, every other layer windowed),
    "llama4" (routing weights on the experts' inputs, a shared expert, chunked RoPE layers, NoPE layers with the query
    temperature, weightless q / k norms, MoE every other layer),
    "deepseek_v3" (MLA, grouped noaux_tc routing, a shared expert, a dense first layer) or "deepseek_v2" (the same
    with group_limited_greedy softmax routing); `overrides` replace config.json fields."""
    from eaglespec.models import get_model_class

    if arch == "qwen3_moe":
        d = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=97, hidden_size=48,
                 intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=3, norm_topk_prob=True,
                 max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False)
    elif arch == "qwen2_moe":
        d = dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", vocab_size=97, hidden_size=48,
                 intermediate_size=80, moe_intermediate_size=24, shared_expert_intermediate_size=40,
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                 num_experts_per_tok=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1e6,
                 tie_word_embeddings=False)
    elif arch == "mixtral":
        d = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=97, hidden_size=48,
                 intermediate_size=24, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                 rope_theta=1e6, tie_word_embeddings=False)
    elif arch == "gpt_oss":
        d = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=97, hidden_size=48,
                 intermediate_size=24, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 num_local_experts=8, num_experts_per_tok=2, sliding_window=8, max_position_embeddings=512,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention"], rms_norm_eps=1e-5,
                 rope_theta=150000.0, swiglu_limit=7.0, attention_bias=True, tie_word_embeddings=False)
    elif arch == "llama4":
        d = dict(architectures=["Llama4ForCausalLM"], model_type="llama4_text", vocab_size=97, hidden_size=48,
                 intermediate_size=24, intermediate_size_mlp=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                 interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=8, floor_scale=4,
                 attn_scale=0.1, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=5e5,
                 tie_word_embeddings=False)
    else:
        d = dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=97, hidden_size=32,
                 intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=4, n_shared_experts=1, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12,
                 v_head_dim=10, routed_scaling_factor=2.5, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1,
                 q_lora_rank=24, max_position_embeddings=512, rope_theta=10000.0, norm_topk_prob=True,
                 topk_method="noaux_tc", scoring_func="sigmoid")
    if arch == "deepseek_v2":
        d.update(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", scoring_func="softmax",
                 topk_method="group_limited_greedy", norm_topk_prob=False)
    cfg = ModelConfig.from_hf({**d, **overrides})
    model = get_model_class(cfg.architecture)(cfg).eval()
    randomize_moe(model, seed)  # O(1) logits and input-dependent routing (the default init routes near-uniformly)
    return model


@torch.no_grad()
def plain_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """One cache-free forward of our model over ids [B, T]: logits [B, T, V]."""
    return model(ids, ForwardContext.plain(*ids.shape)).logits


@torch.no_grad()
def greedy_by_recompute(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens from the cache-free forward over the whole sequence at every step: the reference for the
    engine's cached steps."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(plain_logits(model, torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


FAMILY_PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 2], list(range(20, 45))]


def assert_family_speculates(target: torch.nn.Module, hidden: int, prompts: list[list[int]] = FAMILY_PROMPTS,
                             new_tokens: int = 16, distinct: int = 4, recompute: bool = False) -> list[list[int]]:
    """A model family's speculation check: a tiny drafter (seed 2, width `hidden`) on `target` (a wrapper's
    language model); a chain (3, 1, 4) and a tree (4, 3, 8) over the prompts batched give plain greedy's tokens, and
    those answers do not loop (more than `distinct` different tokens each); with `recompute`, they are also the
    cache-free forward's (`greedy_by_recompute`: the cached steps checked against a reference, not only against
    themselves). Returns the plain tokens."""
    from eaglespec.config import SpecConfig
    from eaglespec.sampling_params import SamplingParams

    drafter = tiny_drafter(getattr(target, "language_model", target), seed=2, hidden=hidden)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    plain = assert_speculation_equals_plain(target, drafter, prompts, params, (SpecConfig(3, 1, 4),
                                                                              SpecConfig(4, 3, 8)))
    assert all(len(set(p)) > distinct for p in plain), plain
    if recompute:
        assert plain == [greedy_by_recompute(target, p, new_tokens) for p in prompts]
    return plain


def assert_matches_transformers(ref: torch.nn.Module, ours: torch.nn.Module, length: int = 40,
                                seed: int = 1) -> None:
    """Our model's logits over two random sequences of `length` tokens equal transformers' model `ref`'s (float32,
    within 1e-4)."""
    ids = torch.randint(0, ref.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = ref(ids).logits
    torch.testing.assert_close(plain_logits(ours, ids), want, rtol=1e-4, atol=1e-4)


def transformers_pair(prefix: str, folder: Path, seed: int = 0, **config) -> tuple[torch.nn.Module, object]:
    """transformers' `{prefix}ForCausalLM` of `{prefix}Config(**config)` (eager attention, `randomize_moe`'s weights),
    saved to `folder` and loaded back by our loader in float32: (transformers' model, our LoadedModel)."""
    import transformers

    from eaglespec.loading import load_model

    hc = getattr(transformers, f"{prefix}Config")(**config)
    hc.architectures = [f"{prefix}ForCausalLM"]
    hc._attn_implementation = "eager"
    ref = getattr(transformers, f"{prefix}ForCausalLM")(hc).eval()
    randomize_moe(ref, seed)
    ref.save_pretrained(folder)
    return ref, load_model(folder, dtype=torch.float32)
