"""DeepSeek-V3: parity with transformers, cached decode, absorbed vs plain MLA, YaRN softmax scale, the router, MoE."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DeepseekV3Config
from transformers import DeepseekV3ForCausalLM as HFDeepseekV3
from tiny import per_expert

from eaglespec.config import MLAConfig, ModelConfig, MoEConfig, RopeConfig
from eaglespec.layers.context import ForwardContext, causal_tail, prefix_tail_mask
from eaglespec.layers.mla import MLAttention
from eaglespec.layers.moe import MoE, NoAuxRouter
from eaglespec.layers.rotary import Rotary
from eaglespec.models import get_model_class
from eaglespec.models.deepseek_v3 import DeepseekV3ForCausalLM, at_least_regex

YARN = dict(
    rope_type="yarn", factor=40.0, original_max_position_embeddings=16, mscale=1.0, mscale_all_dim=1.0,
    beta_fast=32, beta_slow=1, rope_theta=10000.0,
)
COMMON = dict(
    vocab_size=97, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, kv_lora_rank=16, qk_rope_head_dim=8,
    qk_nope_head_dim=12, v_head_dim=10, routed_scaling_factor=2.5, rms_norm_eps=1e-6, tie_word_embeddings=False,
)
# (a) grouped routing, a dense first layer, q LoRA, YaRN (positions run past the original 16);
# (b) one group, every layer MoE, no q LoRA, plain RoPE in halves (rope_interleave False).
CASES = {
    "grouped_yarn": dict(
        COMMON, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1,
        q_lora_rank=24, max_position_embeddings=640, rope_parameters=YARN,
    ),
    "flat_noqlora": dict(
        COMMON, n_routed_experts=6, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=0,
        q_lora_rank=None, max_position_embeddings=256, rope_parameters=dict(rope_type="default", rope_theta=500.0),
        rope_interleave=False, norm_topk_prob=False,
    ),
}


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """O(1) logits and routing that depends on the inputs: transformers' init is too small and its bias is zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" in name:
                continue
            if name.endswith("e_score_correction_bias"):
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
            elif t.dim() == 1:  # norm weights
                t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))


def _pair(case: str, seed: int = 0) -> tuple[HFDeepseekV3, DeepseekV3ForCausalLM]:
    hf_cfg = DeepseekV3Config(**CASES[case])
    hf_cfg._attn_implementation = "eager"
    hf = HFDeepseekV3(hf_cfg).eval()
    _randomize(hf, seed)
    d = hf_cfg.to_dict()
    d["architectures"] = ["DeepseekV3ForCausalLM"]
    cfg = ModelConfig.from_hf(d)
    ours = get_model_class(cfg.architecture)(cfg).eval()
    ours.load_state_dict(per_expert(hf.state_dict()), strict=True)
    return hf, ours


@pytest.fixture(scope="module", params=list(CASES))
def pair(request):
    return _pair(request.param)


def _ids(B: int = 2, T: int = 40, vocab: int = 97) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(1))


def _set_absorb(model: DeepseekV3ForCausalLM, absorb: bool | None) -> None:
    for layer in model.model.layers:
        layer.self_attn.absorb = absorb


@torch.no_grad()
def test_logits_and_aux_match_transformers(pair):
    hf, ours = pair
    ids = _ids()
    ref = hf(ids, output_hidden_states=True)
    ours.set_eagle3_layers_to_capture([0, 1])
    for absorb in (False, True):
        _set_absorb(ours, absorb)
        out = ours(ids, ForwardContext.plain(*ids.shape))
        assert (out.logits - ref.logits).abs().max() <= 1e-4
        H = ours.config.hidden_size
        for j, i in enumerate((0, 1)):
            assert (out.aux_hidden[..., j * H : (j + 1) * H] - ref.hidden_states[i + 1]).abs().max() <= 1e-4
    ours.set_eagle3_layers_to_capture(None)
    _set_absorb(ours, None)
    assert ref.logits.std() > 0.3  # the comparison is not between near-zero logits


def test_model_structure(pair):
    _, ours = pair
    cfg = ours.config
    assert ours.kv_cache_shapes() == [(cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim,)]
    dense = [type(layer.mlp).__name__ for layer in ours.model.layers]
    k = cfg.moe.first_k_dense_replace
    assert dense == ["GatedMLP"] * k + ["MoE"] * (cfg.num_hidden_layers - k)
    half = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16)
    gate = half.model.layers[-1].mlp.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32  # the router stays fp32
    assert half.model.rotary.inv_freq.dtype == torch.float32  # and so do the RoPE frequencies
    assert half.lm_head.weight.dtype == torch.bfloat16
    with torch.device("meta"):  # the loader's path: built on meta under a bf16 default dtype, then materialized
        torch.set_default_dtype(torch.bfloat16)
        try:
            meta = DeepseekV3ForCausalLM(cfg)
        finally:
            torch.set_default_dtype(torch.float32)
    assert meta.model.layers[-1].mlp.gate.e_score_correction_bias.dtype == torch.float32
    assert meta.model.layers[0].self_attn.kv_b_proj.weight.dtype == torch.bfloat16


def test_wrapper_config_reads_text_config():
    text = DeepseekV3Config(**CASES["flat_noqlora"]).to_dict()
    cfg = ModelConfig.from_hf({"architectures": ["KimiK25ForConditionalGeneration"], "text_config": text})
    with torch.device("meta"):
        m = DeepseekV3ForCausalLM(cfg)
    attn = m.model.layers[0].self_attn
    assert attn.interleaved is False and attn.q_lora_rank is None and hasattr(attn, "q_proj")
    assert m.model.layers[0].mlp.gate.n_group == 1 and not m.model.layers[0].mlp.gate.norm_topk_prob


def test_checkpoint_ignore_covers_mtp_layers(pair):
    import re

    _, ours = pair
    n = ours.config.num_hidden_layers
    ign = ours.checkpoint_ignore

    def ignored(name: str) -> bool:
        return any(re.search(p, name) for p in ign)

    assert ignored(f"model.layers.{n}.eh_proj.weight")
    assert ignored(f"model.layers.{n + 7}.self_attn.q_a_proj.weight")
    assert ignored("model.rotary_emb.inv_freq")
    assert not ignored(f"model.layers.{n - 1}.self_attn.q_a_proj.weight")
    assert not ignored(f"model.layers.0.mlp.experts.{n + 3}.up_proj.weight")
    for m in (1, 9, 10, 61, 99, 100, 389):
        pat = re.compile(rf"^{at_least_regex(m)}$")
        assert [i for i in range(0, 1200) if pat.match(str(i))] == list(range(m, 1200))


@torch.no_grad()
@pytest.mark.parametrize("absorb", [False, True])
def test_cached_decode_equals_full_forward(pair, absorb):
    _, ours = pair
    _set_absorb(ours, absorb)
    ids = _ids()
    B, T = ids.shape
    full = ours(ids, ForwardContext.plain(B, T)).logits
    r = ours.kv_cache_shapes()[0][0]
    S_max, Bc = 48, 3
    rows = torch.tensor([2, 0])  # the batch lives in cache rows 2 and 0 of a 3-row cache
    kv = [[torch.zeros(Bc, S_max, r)] for _ in ours.model.layers]
    logits = []
    # prefill 20, then a 5-token chunk (verify-sized), then one token at a time
    start = 0
    for n in [20, 5] + [1] * (T - 25):
        pos = torch.arange(start, start + n).expand(B, n)
        mask = prefix_tail_mask(torch.full((B,), start), causal_tail(B, n, "cpu"), start + n)
        ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=mask, kv=kv, rows=rows)
        logits.append(ours(ids[:, start : start + n], ctx).logits)
        start += n
    _set_absorb(ours, None)
    assert (torch.cat(logits, dim=1) - full).abs().max() <= 1e-4
    assert kv[0][0][1].abs().sum() == 0  # the unused cache row was never written


def _mla(q_lora: int | None, rope: RopeConfig, seed: int = 0, hidden: int = 32) -> MLAttention:
    mla = MLAConfig(q_lora_rank=q_lora, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10)
    torch.manual_seed(seed)
    m = MLAttention(hidden, 4, mla, rope)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0, p.shape[1] ** -0.5)
    return m


@torch.no_grad()
@pytest.mark.parametrize("q_lora", [24, None])
def test_absorbed_equals_plain(q_lora):
    rope = RopeConfig(theta=10000.0)
    m = _mla(q_lora, rope)
    rot = Rotary(8, rope)
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(3))
    ctx = ForwardContext.plain(2, 9)
    cos, sin = rot(ctx.positions)
    m.absorb = False
    plain = m(x, cos, sin, ctx, None)
    m.absorb = True
    absorbed = m(x, cos, sin, ctx, None)
    assert ((absorbed - plain).abs().max() / plain.abs().max()) <= 1e-5
    # auto: absorbed below the FLOP crossover r (nope + v) / (2r - nope - v) = 16 * 22 / 10
    m.absorb = None
    assert m.absorb_below == pytest.approx(35.2)
    assert m.use_absorbed(35) and not m.use_absorbed(36)


def _naive_mla(m: MLAttention, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scale: float):
    """Per-head causal MLA written out with the expanded keys, interleaved-pair RoPE, explicit softmax."""
    B, T, _ = x.shape
    H, dn, dr, dv, r = m.num_heads, m.nope_dim, m.rope_dim, m.v_dim, m.kv_lora_rank
    q = m.q_b_proj(m.q_a_layernorm(m.q_a_proj(x))).view(B, T, H, dn + dr)
    ckv = m.kv_a_proj_with_mqa(x)
    c, k_pe = m.kv_a_layernorm(ckv[..., :r]), ckv[..., r:]
    kv = m.kv_b_proj(c).view(B, T, H, dn + dv)
    ang = positions[..., None].float() * inv_freq  # [B, T, dr/2]

    def rot(t):  # t [..., dr]: pairs (2i, 2i+1) rotated by ang_i
        a = ang.view(B, T, *([1] * (t.dim() - 3)), -1)
        e, o = t[..., 0::2], t[..., 1::2]
        return torch.stack([e * a.cos() - o * a.sin(), o * a.cos() + e * a.sin()], -1).flatten(-2)

    q_pe, k_pe = rot(q[..., dn:]), rot(k_pe)
    out = torch.zeros(B, T, H, dv)
    for h in range(H):
        s = q[..., h, :dn] @ kv[..., h, :dn].transpose(1, 2) + q_pe[..., h, :] @ k_pe.transpose(1, 2)
        s = (s * scale).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        out[:, :, h] = s.softmax(-1) @ kv[..., h, dn:]
    return m.o_proj(out.reshape(B, T, H * dv))


@torch.no_grad()
def test_yarn_softmax_scale_applied_at_every_length():
    rope = RopeConfig(theta=50000.0, type="yarn", factor=64.0, original_max_position_embeddings=4096,
                      mscale=1.0, mscale_all_dim=1.0)
    m = _mla(24, rope)
    expected = (12 + 8) ** -0.5 * (0.1 * math.log(64) + 1) ** 2
    assert m.scale == pytest.approx(expected, rel=1e-12)
    kimi = MLAConfig(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    with torch.device("meta"):
        big = MLAttention(7168, 64, kimi, rope)
    assert big.scale == pytest.approx(192**-0.5 * (0.1 * math.log(64) + 1) ** 2)
    assert big.absorb_below == pytest.approx(512 * 256 / 768)
    # a 3-token sequence (far below 4096) already uses the yarn scale, on both paths
    rot = Rotary(8, rope)
    x = torch.randn(1, 3, 32, generator=torch.Generator().manual_seed(5))
    ctx = ForwardContext.plain(1, 3)
    cos, sin = rot(ctx.positions)
    ref = _naive_mla(m, x, ctx.positions, rot.inv_freq, expected)
    unscaled = _naive_mla(m, x, ctx.positions, rot.inv_freq, 20**-0.5)
    assert (ref - unscaled).abs().max() > 1e-3  # the check can tell the two scales apart
    for absorb in (False, True):
        m.absorb = absorb
        assert (m(x, cos, sin, ctx, None) - ref).abs().max() <= 1e-5


def _router(n_group: int, topk_group: int, bias: list[float], norm: bool = True) -> tuple[NoAuxRouter, torch.Tensor]:
    moe = MoEConfig(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=0, moe_intermediate_size=4,
                    n_group=n_group, topk_group=topk_group, routed_scaling_factor=2.5, norm_topk_prob=norm)
    router = NoAuxRouter(8, moe)
    s = torch.tensor([0.9, 0.1, 0.6, 0.55, 0.2, 0.3, 0.5, 0.52])
    with torch.no_grad():
        router.weight.copy_(torch.eye(8))
        router.e_score_correction_bias.copy_(torch.tensor(bias))
    return router, torch.log(s / (1 - s))[None]  # x = logit(s), so sigmoid(x @ I) = s


def test_router_hand_computed():
    # groups (0,1) (2,3) (4,5) (6,7); scores .9 .1 | .6 .55 | .2 .3 | .5 .52
    # no bias: group sums of top-2: 1.0, 1.15, 0.5, 1.02 -> keep groups 1 and 3 -> experts 2 (.6) and 3 (.55);
    # expert 0 (.9, the best overall) is cut by the group limit.
    router, x = _router(4, 2, [0.0] * 8)
    w, ids = router(x)
    order = ids[0].argsort()
    assert ids[0][order].tolist() == [2, 3]
    torch.testing.assert_close(w[0][order], torch.tensor([0.6, 0.55]) / 1.15 * 2.5)
    # bias +.45 on experts 4, 5: group 2 now sums .65 + .75 = 1.4 -> keep groups 2 and 1 -> biased .75 (5), .65 (4)
    # beat .6 (2); the weights use the unbiased .2 and .3.
    router, x = _router(4, 2, [0, 0, 0, 0, 0.45, 0.45, 0, 0])
    w, ids = router(x)
    order = ids[0].argsort()
    assert ids[0][order].tolist() == [4, 5]
    torch.testing.assert_close(w[0][order], torch.tensor([0.4, 0.6]) * 2.5)
    # without normalisation: the raw scores times the scaling factor
    router, x = _router(4, 2, [0, 0, 0, 0, 0.45, 0.45, 0, 0], norm=False)
    w, ids = router(x)
    torch.testing.assert_close(w[0][ids[0].argsort()], torch.tensor([0.2, 0.3]) * 2.5)
    # one group: plain top-2 of the biased scores: .9 (0) and .75 (5)
    router, x = _router(1, 1, [0, 0, 0, 0, 0.45, 0.45, 0, 0])
    w, ids = router(x)
    order = ids[0].argsort()
    assert ids[0][order].tolist() == [0, 5]
    torch.testing.assert_close(w[0][order], torch.tensor([0.9, 0.3]) / 1.2 * 2.5)


@torch.no_grad()
@pytest.mark.parametrize("n_group,topk_group", [(4, 2), (1, 1)])
def test_moe_matches_per_token_reference(n_group, topk_group):
    moe_cfg = MoEConfig(n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2, moe_intermediate_size=6,
                        n_group=n_group, topk_group=topk_group, routed_scaling_factor=1.7)
    torch.manual_seed(0)
    moe = MoE(16, moe_cfg)
    with torch.no_grad():
        moe.gate.weight.normal_(0, 1)
        moe.gate.e_score_correction_bias.normal_(0, 0.2)
    x = torch.randn(2, 11, 16)
    got = moe(x)
    flat = x.reshape(-1, 16)
    ref = torch.zeros_like(flat)
    per_group = 8 // n_group
    used = set()
    for n in range(flat.shape[0]):
        s = [1 / (1 + math.exp(-float(flat[n] @ moe.gate.weight[e]))) for e in range(8)]
        b = [s[e] + float(moe.gate.e_score_correction_bias[e]) for e in range(8)]
        gscore = [sum(sorted(b[g * per_group : (g + 1) * per_group])[-2:]) for g in range(n_group)]
        groups = sorted(range(n_group), key=lambda g: -gscore[g])[:topk_group]
        allowed = [e for e in range(8) if e // per_group in groups]
        chosen = sorted(allowed, key=lambda e: -b[e])[:3]
        total = sum(s[e] for e in chosen)
        for e in chosen:
            used.add(e)
            ex = moe.experts[e]
            y = ex.down_proj(torch.nn.functional.silu(ex.gate_proj(flat[n])) * ex.up_proj(flat[n]))
            ref[n] += s[e] / total * 1.7 * y
        sh = moe.shared_experts
        ref[n] += sh.down_proj(torch.nn.functional.silu(sh.gate_proj(flat[n])) * sh.up_proj(flat[n]))
    assert len(used) > 3  # several experts were exercised
    torch.testing.assert_close(got.reshape(-1, 16), ref, atol=1e-5, rtol=1e-5)


def test_chunked_and_reused_prefills_answer_as_whole_ones():
    """MLA's cache (one latent per token) through the engine's windows (EngineConfig.prefill_chunk) and a reused
    prefix (engine/scheduler.py): the same greedy answers as whole prefills."""
    from eaglespec.config import EngineConfig
    from eaglespec.engine.engine import Engine
    from eaglespec.sampling_params import SamplingParams

    _, ours = _pair(list(CASES)[0])
    prompt = _ids(1, 40)[0].tolist()
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    whole = Engine(ours, None, EngineConfig(max_batch_size=1, prefill_chunk=None, reuse_prefixes=False))
    eng = Engine(ours, None, EngineConfig(max_batch_size=1, prefill_chunk=16))
    eng.reserve(1, 128)
    want = whole.generate([prompt], params, chat=False)[0].token_ids
    assert eng.generate([prompt], params, chat=False)[0].token_ids == want and len(set(want)) > 3
    follow = prompt + want + prompt[:30]
    out = eng.generate([follow], params, chat=False)[0]
    assert out.cached_tokens == 48 and out.token_ids == whole.generate([follow], params, chat=False)[0].token_ids
