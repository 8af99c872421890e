"""Our Llama against transformers' LlamaForCausalLM on tiny random configs (float32): logits and aux states, and the
cached path (prefill + decode through the engine's KV cache) against the cache-free forward."""

from __future__ import annotations

import pytest
import torch
import transformers

from eaglespec.config import ModelConfig
from eaglespec.engine.kv_cache import KVCache
from eaglespec.layers.context import ForwardContext, causal_mask, causal_tail, prefix_tail_mask
from eaglespec.models.llama import LlamaForCausalLM

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
CASES = {
    "gqa-tied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "mha-untied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "mqa-llama3-rope": dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False,
                            rope_scaling=LLAMA3, rope_theta=500000.0),
    "gqa-head-dim-llama3": dict(num_attention_heads=6, num_key_value_heads=2, head_dim=12,
                                tie_word_embeddings=False, rope_scaling=LLAMA3),
}


def pair(case: str):
    kw = dict(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=5, max_position_embeddings=256,
              rms_norm_eps=1e-5)
    kw.update(CASES[case])
    hc = transformers.LlamaConfig(**kw)
    hc.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(hc).eval()
    with torch.no_grad():  # non-trivial norms so that a norm mix-up shows
        for n, p in ref.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    ours = LlamaForCausalLM(ModelConfig.from_hf(hc.to_dict())).eval()
    ours.load_state_dict(ref.state_dict(), strict=False)
    if hc.tie_word_embeddings:
        ours.lm_head.weight = ours.model.embed_tokens.weight
    return ref, ours


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_aux_match_transformers(case):
    ref, ours = pair(case)
    ids = torch.randint(0, 101, (2, 70), generator=torch.Generator().manual_seed(1))  # past the llama3 original 32
    layers = [0, 1, 3]  # not the last layer: transformers' last hidden state is after the final norm
    ours.set_eagle3_layers_to_capture(layers)
    with torch.no_grad():
        r = ref(ids, output_hidden_states=True)
        o = ours(ids, ForwardContext.plain(2, 70))
    assert (o.logits - r.logits).abs().max().item() <= 1e-4
    expected_aux = torch.cat([r.hidden_states[i + 1] for i in layers], dim=-1)  # output of layer i
    assert (o.aux_hidden - expected_aux).abs().max().item() <= 1e-4


def test_rope_config_read_from_transformers():
    _, ours = pair("mqa-llama3-rope")
    assert ours.config.rope.type == "llama3" and ours.config.rope.factor == 8.0
    assert ours.config.rope.theta == 500000.0


@pytest.mark.parametrize("case", ["gqa-tied", "gqa-head-dim-llama3"])
def test_cached_prefill_and_decode_equal_full_forward(case):
    """Prompts of different lengths prefilled together (right padding), then one token at a time through the cache."""
    _, m = pair(case)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = m(ids, ForwardContext.plain(2, 40)).logits
        kv = KVCache(m.config.num_hidden_layers, m.kv_cache_shapes(), 2, 64, torch.float32, "cpu")
        lens = torch.tensor([25, 31])
        T = 31
        pos = torch.arange(T).expand(2, T)
        zeros = torch.zeros(2, dtype=torch.int64)
        ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=prefix_tail_mask(zeros, causal_tail(2, T, "cpu"), T),
                             kv=kv.layers())
        pre = m(ids[:, :T], ctx).logits
        for b in range(2):
            n = int(lens[b])
            assert (pre[b, :n] - full[b, :n]).abs().max().item() <= 1e-4
        L = lens.clone()
        for _ in range(8):
            tok = ids[torch.arange(2), L][:, None]
            ctx = ForwardContext(positions=L[:, None], write_index=L[:, None],
                                 attn_mask=prefix_tail_mask(L, torch.ones(2, 1, 1, dtype=torch.bool), int(L.max()) + 1),
                                 kv=kv.layers())
            step = m(tok, ctx).logits[:, 0]
            expected = full[torch.arange(2), L]
            assert (step - expected).abs().max().item() <= 1e-4
            L = L + 1


@pytest.mark.parametrize("case", list(CASES))
def test_causal_fast_path_equals_the_masked_forward(case, monkeypatch):
    """`ForwardContext.causal` forwards (plain, and a prefill of fresh right-padded rows through the cache) run SDPA's
    is_causal instead of the mask: the logits equal the masked path's (forced by turning the seam off; GQA, MQA and
    MHA, a head size of 12)."""
    from eaglespec.layers import attention

    _, m = pair(case)
    ids = torch.randint(0, 101, (2, 31), generator=torch.Generator().manual_seed(3))
    lens = [25, 31]
    pos = torch.arange(31).expand(2, 31)

    def run():
        kv = KVCache(m.config.num_hidden_layers, m.kv_cache_shapes(), 3, 64, torch.float32, "cpu")
        ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=causal_mask(pos, 31), kv=kv.layers(),
                             rows=torch.tensor([2, 0]), causal=True)
        with torch.no_grad():
            return m(ids, ForwardContext.plain(2, 31)).logits, m(ids, ctx).logits

    fast = run()  # is_causal, the default
    monkeypatch.setattr(attention, "_is_causal_fast", lambda q: False)
    masked = run()
    assert torch.allclose(fast[0], masked[0], atol=1e-5, rtol=1e-5)
    for b, n in enumerate(lens):  # padded queries compute garbage that nothing reads
        assert torch.allclose(fast[1][b, :n], masked[1][b, :n], atol=1e-5, rtol=1e-5)


def test_engine_prefills_with_the_causal_fast_path_generate_the_same(monkeypatch):
    """The engine marks its prefills `causal` (fresh rows, right-padded together): with the is_causal path (the
    default) and with the masked one, plain and speculative greedy generation of prompts of different lengths in one
    batch is the same."""
    from tiny import tiny_drafter, tiny_llama

    from eaglespec.config import EngineConfig, SpecConfig
    from eaglespec.engine.engine import Engine
    from eaglespec.layers import attention
    from eaglespec.sampling_params import SamplingParams

    t = tiny_llama(seed=0)
    d = tiny_drafter(t, seed=1)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]]
    p = SamplingParams(max_new_tokens=10, ignore_eos=True)

    def run():
        plain = Engine(t, None, EngineConfig(max_batch_size=3)).generate(prompts, p)
        spec = Engine(t, None, EngineConfig(max_batch_size=3), drafter=d, spec=SpecConfig(2, 2, 4)).generate(prompts, p)
        return [o.token_ids for o in plain], [o.token_ids for o in spec]

    with torch.no_grad():
        fast = run()  # is_causal, the default
        monkeypatch.setattr(attention, "_is_causal_fast", lambda q: False)
        masked = run()
    assert fast == masked and masked[0] == masked[1]
