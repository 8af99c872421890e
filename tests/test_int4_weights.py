"""The 4-bit CPU path (`EngineConfig.cpu_weights = "q4"`, engine/int4_weights.py): GGUF 4-bit and Q8_0 groups
recovered exactly from the loader's float32 weights (layers/int4_linear.py), each product and the row-wise attention
(layers/row_attention.py) row-count invariant on this machine, and so greedy speculation equal to plain greedy
decoding token for token in bf16, on a tiny Llama and on the real SmolLM2; what the path cannot run is named."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from tiny import assert_speculation_equals_plain, tiny_drafter, tiny_llama

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.int4_weights import use_int4_weights
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.errors import ConfigError
from eaglespec.layers.context import ForwardContext
from eaglespec.layers import int4_linear
from eaglespec.layers.int4_linear import Int4Linear, four_bit_groups
from eaglespec.layers.row_attention import attend_rows
from eaglespec.loading.gguf_quants import dequantize
from eaglespec.sampling_params import SamplingParams

Q = gguf.GGMLQuantizationType
CPU = torch.device("cpu")


def as_stored(w: torch.Tensor, qtype: Q) -> torch.Tensor:
    """w as a GGUF of `qtype` holds it, dequantized by the engine's loader (float32, w's shape)."""
    data = gguf.quants.quantize(w.detach().float().numpy(), qtype)
    return dequantize(np.ascontiguousarray(data), qtype).reshape(w.shape)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_groups_are_recovered_exactly_and_multiply_as_the_weights(qtype):
    g = torch.Generator().manual_seed(0)
    w = as_stored(torch.randn(40, 96, generator=g) * 0.05, qtype)  # 40 rows: padded to 48 for the kernel
    lin = Int4Linear.from_weight(w)
    assert lin is not None and len(lin.terms) == (2 if qtype == Q.Q8_0 else 1)
    if qtype != Q.Q8_0:
        codes, scale, zero = four_bit_groups(w)
        assert codes.min() >= 0 and codes.max() <= 15
        deq = ((codes.float() - 8).view(40, 3, 32) * scale[..., None] + zero[..., None]).view(40, 96)
        assert torch.equal(deq, w) or torch.allclose(deq, w, rtol=0, atol=1e-6)  # Q4_1: (q - 8) d + (m + 8 d)
    x = torch.randn(5, 96, generator=g)
    y = lin(x.to(torch.bfloat16)).float()
    ref = x.to(torch.bfloat16).float() @ w.t()
    assert y.shape == (5, 40)
    assert (y - ref).abs().max() <= 0.02 * ref.abs().max()  # bf16 activations, bf16 scale and zero


def test_groups_are_recovered_across_chunks_of_rows(monkeypatch):
    """The recovery runs a chunk of rows at a time: Q4_1 rows in one chunk and Q4_0 rows in the next give the codes
    of the whole tensor, and a tensor whose later chunk holds other groups is refused, not half taken."""
    monkeypatch.setattr(int4_linear, "_CHUNK_ELEMENTS", 96 * 8)  # 8 rows a chunk
    g = torch.Generator().manual_seed(4)
    w1, w0 = (as_stored(torch.randn(20, 96, generator=g) * 0.05, q) for q in (Q.Q4_1, Q.Q4_0))
    w = torch.cat([w1, w0])  # chunks 0-1 Q4_1, chunk 2 both, chunks 3-4 Q4_0
    codes, scale, zero = four_bit_groups(w)
    deq = ((codes.float() - 8).view(40, 3, 32) * scale[..., None] + zero[..., None]).view(40, 96)
    assert torch.allclose(deq, w, rtol=0, atol=1e-6) and torch.equal(deq[20:], w[20:])  # Q4_0: exact
    assert torch.equal(scale, torch.cat([four_bit_groups(w1)[1], four_bit_groups(w0)[1]]))
    w8 = as_stored(torch.randn(40, 96, generator=g) * 0.05, Q.Q8_0)
    assert Int4Linear.from_weight(w8) is not None
    assert four_bit_groups(torch.cat([w1, w8])) is None  # the 8-bit rows' chunks: no 4-bit groups
    assert Int4Linear.from_weight(torch.cat([w8, torch.randn(8, 96, generator=g)])) is None  # a float last chunk


@pytest.mark.parametrize("pieces", [[560], [1, 63, 200, 8, 288], [256, 256, 48]], ids=["whole", "odd", "blocks"])
def test_terms_are_packed_a_block_of_rows_at_a_time(pieces):
    """TermBuilder packs blocks of rows through one int32 buffer, fed pieces of rows of any sizes: the packed weight
    equals the packing of the whole tensor at once (rows lay out apart in blocks of _PACK_ROWS; a last block short,
    padded to the kernel's multiple of rows), from uint8 codes as from int32, scales and zeros in order, and its
    products are those of the weights."""
    g = torch.Generator().manual_seed(6)
    n, k = sum(pieces), 4096  # blocks of 256 rows at this K
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32)
    scale, zero = torch.rand(n, k // 32, generator=g) / 8, torch.randn(n, k // 32, generator=g) / 8
    b = int4_linear.TermBuilder(k)
    assert b.block == 256 and b.block % int4_linear._PACK_ROWS == 0
    i = 0
    for size in pieces:
        b.feed(codes[i : i + size].to(torch.uint8), scale[i : i + size], zero[i : i + size])
        i += size
    term = b.finish()
    pad = -n % int4_linear.N_MULTIPLE
    padded = torch.cat([codes, codes.new_zeros(pad, k)])
    assert term.n == n and torch.equal(term.packed, int4_linear._PACK(padded, int4_linear._INNER_K_TILES))
    assert torch.equal(term.scale_zero[:, :n, 0], scale.t().to(torch.bfloat16))
    assert torch.equal(term.scale_zero[:, :n, 1], zero.t().to(torch.bfloat16)) and not term.scale_zero[:, n:].any()
    x = torch.randn(3, k, generator=g).to(torch.bfloat16)
    sz = term.scale_zero[:, :n].float()
    w = ((codes.float() - 8).view(n, -1, 32) * sz[..., 0].t()[..., None] + sz[..., 1].t()[..., None]).view(n, k)
    ref = x.float() @ w.t()
    assert (term(x).float() - ref).abs().max() <= 0.02 * ref.abs().max()


def test_a_packing_not_laid_out_by_rows_is_packed_whole(monkeypatch):
    """A build whose packing does not lay out rows (found at the first block): TermBuilder keeps the codes and packs
    the whole tensor at the end, whatever pieces it was fed."""
    real = int4_linear._PACK
    monkeypatch.setattr(int4_linear, "_PACK", lambda c, tiles: real(c, tiles).t().contiguous())  # [K / 2, N]
    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 16, (600, 4096), generator=g, dtype=torch.int32)
    scale, zero = torch.rand(600, 128, generator=g), torch.zeros(600, 128)
    b = int4_linear.TermBuilder(4096)
    for a in range(0, 600, 250):
        b.feed(codes[a : a + 250].to(torch.uint8), scale[a : a + 250], zero[a : a + 250])
    padded = torch.cat([codes, codes.new_zeros(8, 4096)])
    assert torch.equal(b.finish().packed, int4_linear._PACK(padded, 1))


def test_weights_of_other_types_are_not_taken():
    g = torch.Generator().manual_seed(1)
    assert Int4Linear.from_weight(torch.randn(32, 64, generator=g)) is None  # float weights
    assert Int4Linear.from_weight(torch.randn(32, 64, generator=g).half().float()) is None  # float16 weights
    assert Int4Linear.from_weight(torch.zeros(32, 48)) is None  # K not a multiple of the group


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_products_are_row_count_invariant(qtype):
    """Each row of an M-row product has the bits of that row multiplied alone (what makes a verify of D tokens
    give a one-token step's logits)."""
    g = torch.Generator().manual_seed(2)
    lin = Int4Linear.from_weight(as_stored(torch.randn(192, 128, generator=g) * 0.05, qtype))
    x = torch.randn(8, 128, generator=g).to(torch.bfloat16)
    alone = [lin(x[i : i + 1]) for i in range(8)]
    for m in (2, 3, 4, 6, 8):
        y = lin(x[:m])
        assert all(torch.equal(y[i : i + 1], alone[i]) for i in range(m)), m


def test_row_attention_is_the_same_bits_in_any_forward_and_is_attention():
    """A verify's query rows (a chain: a prefix of the cache each; a tree node: the prefix and its ancestors, not
    adjacent in the cache) give the bits they give alone, and agree with SDPA over the same keys."""
    g = torch.Generator().manual_seed(3)
    B, S, H, Hkv, D, L = 2, 40, 4, 2, 16, 20
    k = torch.randn(B, S, Hkv, D, generator=g).to(torch.bfloat16)
    v = torch.randn(B, S, Hkv, D, generator=g).to(torch.bfloat16)
    q = torch.randn(B, 4, H, D, generator=g).to(torch.bfloat16)
    # nodes at L..L+3: row 0 a chain (node t sees 0..L+t), row 1 a tree (nodes 1 and 2 children of 0, 3 of 2)
    parents = [[-1, 0, 1, 2], [-1, 0, 0, 2]]
    mask = torch.zeros(B, 4, S, dtype=torch.bool)
    for b in range(B):
        for t in range(4):
            mask[b, t, :L] = True
            n = t
            while n >= 0:
                mask[b, t, L + n] = True
                n = parents[b][n]
    pos = torch.arange(L, L + 4).expand(B, 4)
    ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=mask)
    out = attend_rows(q, ctx, (k, v))
    for b in range(B):
        for t in range(4):
            one = ForwardContext(positions=pos[b : b + 1, t : t + 1], write_index=pos[b : b + 1, t : t + 1],
                                 attn_mask=mask[b : b + 1, t : t + 1], rows=torch.tensor([b]))
            assert torch.equal(attend_rows(q[b : b + 1, t : t + 1], one, (k, v))[0, 0], out[b, t]), (b, t)
    kk, vv = k.float().repeat_interleave(2, 2), v.float().repeat_interleave(2, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float().transpose(1, 2), kk.transpose(1, 2),
                                                           vv.transpose(1, 2), attn_mask=mask[:, None])
    assert torch.allclose(out.float(), ref.transpose(1, 2), atol=1e-2)
    assert not torch.equal(out[1, 1], out[0, 1])  # (the tree's node 1 sees other keys than the chain's)


def stored_llama(tie: bool) -> torch.nn.Module:
    """A tiny float32 Llama whose projections hold Q4_1 groups (a tied embedding and head Q8_0, else the head
    Q4_0), as a GGUF of them loads."""
    target = tiny_llama(seed=0, tie=tie)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if p.dim() == 2:
                kind = Q.Q8_0 if "embed" in name else Q.Q4_0 if "lm_head" in name else Q.Q4_1
                p.copy_(as_stored(p, kind))
    return target


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "modules"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_greedy_speculation_equals_plain_on_the_4bit_path(tie, use_kernels, monkeypatch):
    """Chains and trees, one and three rows, bf16: every token plain decoding's (the engine's central invariant),
    through the numba layer steps (engine/int4_step.py) and through the modules (a machine without numba)."""
    from eaglespec.engine import int4_step

    monkeypatch.setattr(int4_step, "USE_KERNELS", use_kernels)
    target = stored_llama(tie)
    prepare_for_inference(target, CPU, None, None, int4=True)
    assert target.int4_steps == (6 if use_kernels else 0)
    assert isinstance(target.lm_head, Int4Linear) and target.model.embed_tokens.weight.dtype == torch.bfloat16
    assert all(m.row_invariant for m in target.modules() if hasattr(m, "row_invariant"))
    drafter = prepare_for_inference(tiny_drafter(target, seed=1).to(torch.bfloat16), CPU, None, None)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompts = [[5, 17, 3, 9], [11, 2, 40, 7, 7, 1, 30], [60, 3, 44]]
    specs = [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6), SpecConfig(4, 4, 12)]
    for batch in ([prompts[0]], prompts):
        plain = assert_speculation_equals_plain(target, drafter, batch, params, specs)
        assert all(len(set(p)) > 5 for p in plain)  # not a degenerate loop


def test_smollm2_speculates_losslessly_on_its_4bit_weights():
    """The embedded SmolLM2 (Q4_1 projections, Q8_0 tied embedding) with its shipped drafter: the answers of a chain
    and of a tree equal its plain answers in the same engine."""
    from eaglespec import api
    from eaglespec.assets import default_drafter_path
    from eaglespec.engine.engine import Engine

    cfg = EngineConfig(max_batch_size=2, cpu_weights="q4")
    spec = api.load(draft=str(default_drafter_path()), spec=SpecConfig(2, 1, 3), config=cfg)
    target = spec.runner.target
    assert spec.dtype == torch.bfloat16 and len(target.lm_head.terms) == 2  # the head: Q8_0 as two products
    assert target.lm_head.weight is target.model.embed_tokens.weight  # get_embed_and_head: still tied
    drafter = spec.runner.drafter  # its products quantized, its forwards through the kernels (engine/int4_drafter.py)
    assert isinstance(drafter.lm_head, Int4Linear) and drafter.cpu_step is not None
    prompts = ["What is the capital of France? Answer in one sentence.", "Write a haiku about the sea."]
    params = SamplingParams(max_new_tokens=32)
    plain = [o.token_ids for o in Engine(target, spec.tokenizer, cfg).generate(prompts, params)]
    assert [o.token_ids for o in spec.generate(prompts, params)] == plain and spec.stats.verify_steps > 0
    tree = Engine(target, spec.tokenizer, cfg, drafter=spec.runner.drafter, spec=SpecConfig(2, 2, 4))
    assert [o.token_ids for o in tree.generate(prompts, params)] == plain
    assert "Paris" in spec.tokenizer.decode(plain[0])


def test_what_the_4bit_path_cannot_run_is_named():
    with pytest.raises(ConfigError, match="must be auto, dense or q4"):
        EngineConfig(cpu_weights="q8")
    with pytest.raises(ConfigError, match="computes in bfloat16.*not with --dtype float32"):
        EngineConfig(cpu_weights="q4", dtype="float32")
    with pytest.raises(ConfigError, match="runs eager: compiled elementwise chains are not row-invariant"):
        EngineConfig(cpu_weights="q4", compile=True)
    with pytest.raises(ConfigError, match="runs on the CPU; not with --device cuda"):
        EngineConfig(cpu_weights="q4", device="cuda")
    plain = tiny_llama(seed=0)  # float weights, not 4-bit groups: named, and nothing changed
    with pytest.raises(ConfigError, match=r"needs a GGUF's quantized groups \(Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0, Q2_K "
                                          r"to Q6_K, IQ3_S / IQ4_NL / IQ4_XS\); lm_head \[97 x 64\] is none of them"):
        use_int4_weights(plain)
    assert type(plain.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert not plain.model.layers[0].self_attn.row_invariant
    with pytest.raises(ConfigError, match="load in float32"):
        use_int4_weights(stored_llama(True).to(torch.bfloat16))
    from eaglespec.engine.engine import Engine

    target = stored_llama(True)
    use_int4_weights(target)  # a verify past the row-wise attention's 64 tokens would not be lossless: refused
    with pytest.raises(ConfigError, match="verifies at most 64 draft tokens a step .* got --draft-tokens 65"):
        Engine(target, None, drafter=tiny_drafter(target).to(torch.bfloat16), spec=SpecConfig(8, 10, 65))


def test_a_model_without_grouped_query_attention_is_refused():
    from test_deepseek_v3 import CASES
    from transformers import DeepseekV3Config

    from eaglespec.config import ModelConfig
    from eaglespec.models import get_model_class

    d = DeepseekV3Config(**next(iter(CASES.values()))).to_dict()
    d["architectures"] = ["DeepseekV3ForCausalLM"]
    cfg = ModelConfig.from_hf(d)
    with pytest.raises(ConfigError, match="runs grouped-query attention only; DeepseekV3ForCausalLM's "
                                          "model.layers.0.self_attn is MLAttention"):
        use_int4_weights(get_model_class(cfg.architecture)(cfg))


def test_generate_and_bench_on_the_4bit_path(tmp_path, capsys, monkeypatch):
    """`eaglespec generate --cpu-weights q4`: the embedded model in bf16, its greedy steps speculating in the chain its
    own cost model picks from forwards timed as verifies (`assets.INT4_GREEDY`), to plain decoding's answer; plain
    where that model says speculation would not pay (and why), and when sampling (measured no faster there);
    `bench --cpu-weights q4` runs the same path and finds speculation's answers plain decoding's."""
    import json

    from test_cli import cpu_forward_cost, run_cli

    from eaglespec.assets import INT4_GREEDY, INT4_SAMPLED_NOTE

    stats = tmp_path / "stats.json"
    prompt = ["What is the capital of France?", "--max-new-tokens", "12", "--cpu-weights", "q4"]
    code, out, err = run_cli(["generate", *prompt, "--no-spec", "--stats-json", str(stats)], capsys)
    s = json.loads(stats.read_text())
    assert code == 0 and "Paris" in out and s["dtype"] == "bfloat16" and not s["speculative"]
    # a machine where 2 / 3 / 4 tokens cost 1.05x / 1.10x / 1.30x a decode step -> the chain of 2 (1.91 / (1.10 +
    # 0.15 + 2 x 0.08) = 1.35x; the chain of 1 1.23x, of 3 1.22x)
    asked = cpu_forward_cost(monkeypatch, {2: 1.05, 3: 1.10, 4: 1.30})
    code, spec, err = run_cli(["generate", *prompt, "--stats-json", str(stats)], capsys)
    s = json.loads(stats.read_text())
    assert code == 0 and spec == out and s["speculative"] and asked == [[2, 3, 4]]  # (greedy shapes alone)
    assert "(S=2 K=1 D=3)" in err, err
    # a machine whose verifies cost a little more than session 72's Zen 4 EPYC's (1.26-1.31x / 1.48-1.51x /
    # 1.73-1.79x), which leaves the chains at about 1.00x / 1.03x / 0.94x: plain, and why
    cpu_forward_cost(monkeypatch, {2: 1.35, 3: 1.55, 4: 1.80})
    code, plain, err = run_cli(["generate", *prompt, "--stats-json", str(stats)], capsys)
    assert code == 0 and plain == out and not json.loads(stats.read_text())["speculative"]
    assert ("here forwards of 2 / 3 / 4 tokens cost 1.35x / 1.55x / 1.80x one of 1 token: greedy speculation's best "
            "shape, S2 K1 D3, would run about 1.03x plain decoding by the 4-bit CPU path's cost model, under the "
            f"{INT4_GREEDY.min_speedup}x it takes to speculate") in err, err
    asked = cpu_forward_cost(monkeypatch, 1.0)  # sampling: plain, nothing timed
    code, _, err = run_cli(["generate", *prompt, "--temperature", "1", "--seed", "0"], capsys)
    assert code == 0 and INT4_SAMPLED_NOTE in err and not asked
    code, spec, err = run_cli(["generate", *prompt, "--spec", "2,1,3", "--stats-json", str(stats)], capsys)
    assert code == 0 and spec == out and json.loads(stats.read_text())["speculative"]
    code, _, err = run_cli(["generate", "Hi", "--cpu-weights", "q4", "--dtype", "float32"], capsys)
    assert code != 0 and "--cpu-weights q4 computes in bfloat16" in err
    code, _, err = run_cli(["generate", "Hi", "--cpu-weights", "q4", "--device", "cuda"], capsys)
    assert code != 0 and "--cpu-weights q4 runs on the CPU; not with --device cuda" in err
    code, table, err = run_cli(["bench", "--device", "cpu", "--cpu-weights", "q4", "--limit", "2",
                                "--max-new-tokens", "8", "--no-spec", "--spec", "2,1,3", "--out",
                                str(tmp_path / "b")], capsys)
    assert code == 0, err
    records = json.loads((tmp_path / "b" / "results.json").read_text())["records"]
    assert [r["identical_outputs"] for r in records] == [2, 2] and "bfloat16" in table


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "modules"])
def test_the_4bit_paths_forwards_are_timed_as_verifies(tmp_path, monkeypatch, use_kernels):
    """`verify_cost_ratios(as_verify=True)` (what `auto` times on the 4-bit path, whose attention differs between a
    cache-free forward and a step's): each forward runs through a KV cache after VERIFY_PREFIX tokens, the 1-token
    reference as a decode step, every one through the row-wise attention, each query seeing the prefix and the
    tokens before it; its rounds are kept in the record apart from the cache-free ones."""
    import json

    from eaglespec.engine import verify_cost
    from eaglespec.layers import attention

    from eaglespec.engine import int4_step
    from eaglespec.layers import int4_step_kernels as kernels

    monkeypatch.setattr(int4_step, "USE_KERNELS", use_kernels)
    target = stored_llama(True)
    prepare_for_inference(target, CPU, None, None, int4=True)
    seen: list[tuple[int, list[int]]] = []  # (query tokens, visible keys of each) per layer's attention call
    if use_kernels:  # the numba layer steps (engine/int4_step.py)
        real = kernels.rope_store_attend

        def step_spy(qkv, cos, sin, k_cache, v_cache, rows, slots, vis_n, *rest):
            seen.append((qkv.shape[0], [int(n) for n in vis_n]))
            return real(qkv, cos, sin, k_cache, v_cache, rows, slots, vis_n, *rest)

        monkeypatch.setattr(kernels, "rope_store_attend", step_spy)
    else:  # the module path's row-wise attention
        def spy(q, ctx, cache, *args, **kw):
            seen.append((q.shape[1], [int(n) for n in ctx.mask().sum(-1)[0]]))
            return attend_rows(q, ctx, cache, *args, **kw)

        monkeypatch.setattr(attention, "attend_rows", spy)
    record = tmp_path / "costs.json"
    ratios = verify_cost.verify_cost_ratios(target, [3], repeats=2, record=record, as_verify=True)
    layers = target.config.num_hidden_layers
    p = verify_cost.VERIFY_PREFIX
    # a warm-up of each size, then two rounds of (1 token, 3 tokens), every layer row by row
    assert [n for n, _ in seen[::layers]] == [1, 3, 1, 3, 1, 3] and len(seen) == 6 * layers
    assert seen[0][1] == [p + 1] and seen[layers][1] == [p + 1, p + 2, p + 3]
    assert set(ratios) == {3} and ratios[3] > 0
    seen.clear()
    verify_cost.verify_cost_ratios(target, [3], repeats=2, record=record)  # cache-free: SDPA, its own record
    assert seen == [] and sorted(json.loads(record.read_text())) == sorted(
        [verify_cost.machine_key(target), verify_cost.machine_key(target) + ":verify"])


def test_cpu_weights_auto_takes_the_4bit_path_where_it_applies(monkeypatch):
    """EngineConfig's default, `cpu_weights="auto"` (`int4_weights.int4_mode`): the 4-bit path on an x86-64 CPU for
    engines of at most INT4_DEFAULT_MAX_ROWS rows in dtype auto, uncompiled, where every weight and module allows it;
    dense otherwise (more rows, a dtype or compile asked for, the CUDA device, another CPU architecture, or weights
    of other types: no error, the model unchanged). "q4" requires the path; "dense" never takes it. An engine built
    to sample on the 4-bit path decodes plainly and says why (measured no faster: assets.INT4_SAMPLED_NOTE)."""
    import platform

    from eaglespec import api
    from eaglespec.assets import INT4_SAMPLED_NOTE
    from eaglespec.engine.int4_weights import INT4_DEFAULT_MAX_ROWS, int4_mode

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    cuda = torch.device("cuda")
    assert int4_mode("auto", CPU, "auto", None, 1) is None  # where the weights allow
    assert int4_mode("auto", CPU, "auto", False, INT4_DEFAULT_MAX_ROWS) is None
    assert int4_mode("q4", CPU, "auto", None, 32) is True
    for args in [("auto", CPU, "auto", None, INT4_DEFAULT_MAX_ROWS + 1), ("auto", CPU, "float32", None, 1),
                 ("auto", CPU, "bfloat16", None, 1), ("auto", CPU, "auto", True, 1), ("auto", cuda, "auto", None, 1),
                 ("dense", CPU, "auto", None, 1)]:
        assert int4_mode(*args) is False, args
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert int4_mode("auto", CPU, "auto", None, 1) is False and int4_mode("q4", CPU, "auto", None, 1) is True
    dense = prepare_for_inference(tiny_llama(seed=0), CPU, None, None, int4=None)  # float weights: stays dense
    assert not getattr(dense, "int4_weights", False) and not any(isinstance(m, Int4Linear) for m in dense.modules())
    assert next(dense.parameters()).dtype == torch.float32
    stored = prepare_for_inference(stored_llama(True), CPU, None, None, int4=None)
    assert stored.int4_weights and isinstance(stored.lm_head, Int4Linear)
    with pytest.raises(ConfigError, match="needs a GGUF.s quantized groups"):  # required: the refusal is the answer
        prepare_for_inference(tiny_llama(seed=0), CPU, None, None, int4=True)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    # a one-row engine built to sample (`eaglespec generate --temperature 1`): the 4-bit path, plain, and why
    sampling = api.load(config=EngineConfig(device="cpu", max_batch_size=1), temperature=1.0)
    assert sampling.runner.target.int4_weights and not sampling.speculative
    assert sampling.plain_note == INT4_SAMPLED_NOTE
    del sampling
    # `serve`'s engine of 4 rows: dense (its drafter aside: nothing timed)
    served = api.load(draft=None, config=EngineConfig(device="cpu", max_batch_size=4, spec_max_rows=1))
    assert not getattr(served.runner.target, "int4_weights", False) and served.dtype == torch.float32


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_bench_counts_the_packed_weights_a_4bit_step_reads(tie):
    """`bench`'s bytes a decode step reads (its bandwidth column) on the 4-bit path: every projection's and the head's
    packed codes and bf16 scales / zeros, the bf16 norms; neither the embedding table (B rows a step) nor a head's
    kept `weight`, which the products never read."""
    from eaglespec.bench.bandwidth import weight_bytes_per_step

    target = prepare_for_inference(stored_llama(tie), CPU, None, None, int4=True)
    packed = sum(t.packed.nbytes + t.scale_zero.nbytes for m in target.modules() if isinstance(m, Int4Linear)
                 for t in m.terms)
    norms = sum(p.numel() * 2 for n, p in target.named_parameters() if p.dim() == 1)
    assert weight_bytes_per_step(target) == packed + norms
    # under 8 bits a weight on average (4.5 for a 4-bit group, 9 for a Q8_0 tensor's two products)
    assert packed < sum(p.numel() for p in stored_llama(tie).parameters() if p.dim() == 2)
