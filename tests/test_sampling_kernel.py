"""The sampling-distribution Triton kernel (`target_probs` on CUDA), run by Triton's interpreter on the CPU, against
the PyTorch path; and sampled speculation through it drawing the same tokens as through the PyTorch path."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is built (it is built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import tiny_drafter, tiny_llama  # noqa: E402

import eaglespec.engine.runner as runner_mod  # noqa: E402
import eaglespec.engine.spec_step as spec_step_mod  # noqa: E402
import eaglespec.spec.draft as draft_mod  # noqa: E402
from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.layers import sampling, sampling_kernel  # noqa: E402
from eaglespec.layers.sampling import target_probs_reference as reference  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402


# per row: (temperature, top_k, top_p): greedy, plain, top-k (1, small, >= V), top-p (wide, narrow, tiny), both
ROWS = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 1, 1.0), (1.3, 0, 0.9), (0.5, 50, 0.8), (2.0, 10**6, 0.3),
        (1.0, 0, 1e-6), (0.9, 20, 0.95)]


@pytest.mark.parametrize("V,one_tile", [(50, None), (1000, None), (3001, None), (8192, None), (9000, None),
                                        (9000, 4096), (20000, 4096)])  # past CHUNK (4096): plain rows over chunks;
# past ONE_TILE (32,768; here lowered to 4,096 for the interpreter's sake): the whole-row kernel streams tiles
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_the_pytorch_path(V, one_tile, dtype, monkeypatch):
    if one_tile is not None:
        monkeypatch.setattr(sampling_kernel, "ONE_TILE", one_tile)
    g = torch.Generator().manual_seed(V)
    x = (torch.randn(len(ROWS), V, generator=g) * 3).to(dtype)
    T, K, P = (torch.tensor([r[i] for r in ROWS]) for i in range(3))
    got, ref = sampling_kernel.target_probs(x, T, K, P), reference(x, T, K, P)
    assert got.dtype == torch.float32 and got.shape == (len(ROWS), V)
    nucleus = P < 1
    if dtype == torch.float32:  # tie-free rows: the same support, probabilities to float32 rounding
        assert torch.equal(got > 0, ref > 0) and torch.allclose(got, ref, atol=2e-7, rtol=1e-5)
    else:  # bf16 logits tie; rows without a nucleus agree, a nucleus keeps tokens tied at its edge together
        assert torch.allclose(got[~nucleus], ref[~nucleus], atol=2e-7, rtol=1e-5)
        assert bool(((ref[nucleus] > 0) <= (got[nucleus] > 0)).all())
    assert torch.allclose(got.sum(1), torch.ones(len(ROWS)), atol=1e-5)
    assert got[0].tolist() == torch.nn.functional.one_hot(x[0].float().argmax(), V).float().tolist()
    if dtype == torch.float32:  # top-k 1 and a tiny nucleus: one token (bf16 maxima may tie: both keep the ties)
        assert int((got[3] > 0).sum()) == 1 and int((got[7] > 0).sum()) == 1


def test_ties(monkeypatch):
    """Greedy takes the first of equal maxima; top-k keeps every token equal to the k-th largest (as the PyTorch
    path does); a nucleus keeps tokens of equal probability at its edge together."""
    x = torch.zeros(3, 40)
    x[:, [31, 5, 17]] = 2.0
    x[:, 9] = 1.0
    T, K, P = torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0, 2, 0]), torch.tensor([1.0, 1.0, 0.3])
    got = sampling_kernel.target_probs(x, T, K, P)
    assert got[0].nonzero().flatten().tolist() == [5]
    assert got[1].nonzero().flatten().tolist() == [5, 17, 31]  # the 2nd largest value is 2.0: all three stay
    assert torch.allclose(got[1], reference(x, T, K, P)[1])
    assert got[2].nonzero().flatten().tolist() == [5, 17, 31]  # each holds < 0.3; together they cross it
    assert torch.allclose(got[2, [5, 17, 31]], torch.full((3,), 1 / 3))
    # past ONE_TILE (lowered here) the whole-row kernel reads a row tile by tile in each pass: the same rules across
    # tiles
    monkeypatch.setattr(sampling_kernel, "ONE_TILE", sampling_kernel.MAX_TILE)
    n = 2 * sampling_kernel.MAX_TILE + 100
    x = torch.full((4, n), -30.0)  # the background holds ~1e-9 of the mass
    x[:, [n - 1, 7, sampling_kernel.MAX_TILE + 5]] = 2.0
    x[:, sampling_kernel.MAX_TILE - 1] = 1.0
    T, K, P = torch.tensor([0.0, 1.0, 1.0, 1.0]), torch.tensor([0, 2, 0, 4]), torch.tensor([1.0, 1.0, 0.3, 0.999])
    got = sampling_kernel.target_probs(x, T, K, P)
    assert got[0].nonzero().flatten().tolist() == [7]
    assert got[1].nonzero().flatten().tolist() == [7, sampling_kernel.MAX_TILE + 5, n - 1]
    assert got[2].nonzero().flatten().tolist() == [7, sampling_kernel.MAX_TILE + 5, n - 1]
    # top-k 4 keeps the 1.0 too; inside it the nucleus of 0.999 needs all four
    assert got[3].nonzero().flatten().tolist() == [7, sampling_kernel.MAX_TILE - 1, sampling_kernel.MAX_TILE + 5, n - 1]
    assert torch.allclose(got[[1, 3]], reference(x, T, K, P)[[1, 3]], atol=1e-7)  # (row 2: the sort splits the tie)
    # past CHUNK the plain rows run over chunks: the first maximum across chunks, one softmax over all of them
    x = torch.zeros(2, 3 * sampling_kernel.CHUNK + 11)
    x[:, [3 * sampling_kernel.CHUNK + 2, 100, sampling_kernel.CHUNK + 7]] = 2.0
    T, K, P = torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), torch.tensor([1.0, 1.0])
    got = sampling_kernel.target_probs(x, T, K, P)
    assert got[0].nonzero().flatten().tolist() == [100]
    assert torch.allclose(got[1], reference(x, T, K, P)[1], atol=1e-9, rtol=1e-5)


def test_strided_rows_and_fits():
    x = torch.randn(4, 2, 64, generator=torch.Generator().manual_seed(2))[:, 1]  # rows strided by 128
    T, K, P = torch.tensor([1.0, 0.5, 0.0, 1.0]), torch.tensor([0, 3, 0, 0]), torch.tensor([0.9, 1.0, 1.0, 1.0])
    assert torch.allclose(sampling_kernel.target_probs(x, T, K, P), reference(x, T, K, P), atol=2e-7)
    assert sampling_kernel.target_probs(x[:0], T[:0], K[:0], P[:0]).shape == (0, 64)
    assert sampling_kernel.fits(49152) and sampling_kernel.fits(128256) and not sampling_kernel.fits(200_000)


def test_top_p_one_keeps_the_tail():
    """top_p = 1 turns the nucleus off in both paths (the PyTorch path's float32 running sum reaches 1 before the
    tail of tiny probabilities; it used to drop that tail)."""
    x = torch.randn(2, 1000, generator=torch.Generator().manual_seed(0)) * 3
    T, K, P = torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2)
    for probs in (sampling_kernel.target_probs(x, T, K, P), reference(x, T, K, P)):
        assert bool((probs > 0).all())


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)], ids=["chain", "tree"])
def test_sampled_speculation_through_the_kernel_draws_the_same_tokens(monkeypatch, spec):
    """The engine's sampled paths (decode, drafting, verification) call `target_probs`; routed through the kernel
    (the CUDA path) they draw, with the same seed, the tokens the PyTorch path draws (the distributions agree to
    float32 rounding, and the random draws are the same)."""
    target = tiny_llama(seed=5, vocab=64, hidden=32, layers=2, std=0.35)
    drafter = tiny_drafter(target, seed=6, draft_vocab=None, hidden=32, std=0.35)
    params = SamplingParams(max_new_tokens=6, temperature=0.9, top_p=0.9, top_k=20, ignore_eos=True)

    def run() -> list[list[int]]:
        eng = Engine(target, None, EngineConfig(max_batch_size=2, seed=3), drafter=drafter, spec=spec)
        return [o.token_ids for o in eng.generate([[1, 2, 3], [4, 5]], params)]

    plain = run()
    calls = []

    def through_kernel(logits, t, k, p):
        calls.append(tuple(logits.shape))
        return sampling_kernel.target_probs(logits, t, k, p)

    def draw_through_kernel(where):
        def draw(logits, t, k, p, generator=None, table=None):
            calls.append(where)
            return sampling.sample_probs(logits, t, k, p, generator, table, kernels=True)
        return draw

    monkeypatch.setattr(spec_step_mod, "target_probs", through_kernel)
    monkeypatch.setattr(runner_mod, "sample_probs", draw_through_kernel("decode"))
    monkeypatch.setattr(draft_mod, "sample_probs", draw_through_kernel("draft"))
    assert run() == plain
    # decode steps (and a chain's draft levels) drew through the race kernels, verification through target_probs
    assert "decode" in calls and any(isinstance(c, tuple) for c in calls)
    assert ("draft" in calls) == (spec.topk == 1)  # trees draft their top-K deterministically


@pytest.mark.parametrize("V", [50, 3001, 4096, 9000, 20000])  # up to 4096: the whole-row kernel races; past it
# plain rows race in the chunk-probabilities kernel, filtering rows in the chunk race kernel
def test_race_inside_the_kernels_draws_what_sample_draws(V):
    """`sample_probs` through the kernels: the probabilities of `target_probs` and, for the same Exp(1) draws, the
    token `greedy_ids(probs / max(e, 1e-30))` picks (through a table too), for greedy, plain and filtering rows."""
    g = torch.Generator().manual_seed(V + 1)
    x = torch.randn(len(ROWS), V, generator=g) * 3
    T, K, P = (torch.tensor([r[i] for r in ROWS]) for i in range(3))
    for _ in range(3):
        noise = sampling._exponential((len(ROWS), V), x.device, g)
        noise[:, :7] = 0.0  # zero draws are clamped, as exponential_noise does
        ids, probs = sampling_kernel.sample_probs(x, T, K, P, noise)
        assert torch.equal(probs, sampling_kernel.target_probs(x, T, K, P))
        want = (probs / noise.clamp_min(1e-30)).argmax(-1)
        assert ids.tolist() == want.tolist()
        assert int(ids[0]) == int(x[0].argmax())  # greedy row: its argmax whatever the draws
        assert bool((probs.gather(1, ids[:, None]) > 0).all())  # never a token outside the row's support
        table = torch.randperm(V, generator=g) + 1000
        assert sampling_kernel.sample_probs(x, T, K, P, noise, table)[0].tolist() == table[want].tolist()


def test_race_ties_take_the_first_index_across_chunks():
    """Equal ratios in two chunks: the first index wins (torch.argmax's rule, as `sample` through `greedy_ids`)."""
    V = 2 * sampling_kernel.CHUNK + 5
    x = torch.full((2, V), -30.0)
    x[:, [sampling_kernel.CHUNK + 3, 9]] = 5.0  # two equally likely tokens, in chunks 1 and 0
    T, K, P = torch.ones(2), torch.tensor([0, 2]), torch.ones(2)  # row 1 takes the whole-row kernel (top-k)
    noise = torch.ones(2, V)
    assert sampling_kernel.sample_probs(x, T, K, P, noise)[0].tolist() == [9, 9]
    assert sampling_kernel.sample_probs(x[:0], T[:0], K[:0], P[:0], noise[:0])[0].shape == (0,)


def test_sample_probs_draws_like_sample():
    """The CPU path and the kernel path of `layers.sampling.sample_probs` take the same draws from the generator."""
    x = torch.randn(5, 300, generator=torch.Generator().manual_seed(4)) * 2
    T, K, P = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0]), torch.tensor([0, 0, 5, 0, 40]), torch.tensor([1, 1, 1, .8, .9])
    a = sampling.sample_probs(x, T, K, P, torch.Generator().manual_seed(9))
    b = sampling.sample_probs(x, T, K, P, torch.Generator().manual_seed(9), kernels=True)
    assert a[0].tolist() == b[0].tolist() and torch.allclose(a[1], b[1], atol=2e-7)


def test_banned_tokens_get_no_probability_in_the_kernel():
    """Adjusted logits (layers/logit_adjust.py: banned stop tokens, min-p's cut) carry -inf entries: the kernel gives
    them probability 0 and the rest what the PyTorch path gives, greedy rows included."""
    g = torch.Generator().manual_seed(3)
    for V in (50, 9000):
        x = torch.randn(len(ROWS), V, generator=g) * 3
        x[:, ::3] = float("-inf")
        T, K, P = (torch.tensor([r[i] for r in ROWS]) for i in range(3))
        got, ref = sampling_kernel.target_probs(x, T, K, P), reference(x, T, K, P)
        assert bool((got[:, ::3] == 0).all()) and torch.allclose(got, ref, atol=2e-7, rtol=1e-5)


def test_adjusted_sampled_speculation_through_the_kernel_draws_the_same_tokens(monkeypatch):
    """Penalties, logit_bias and min_p in front of the kernels (the CUDA path) draw what the PyTorch path draws."""
    target = tiny_llama(seed=5, vocab=64, hidden=32, layers=2, std=0.35)
    drafter = tiny_drafter(target, seed=6, draft_vocab=None, hidden=32, std=0.35)
    params = SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.9, ignore_eos=True, frequency_penalty=0.6,
                            repetition_penalty=1.2, min_p=0.05, logit_bias={7: 3.0})

    def run() -> list[list[int]]:
        eng = Engine(target, None, EngineConfig(max_batch_size=2, seed=3), drafter=drafter, spec=SpecConfig(3, 2, 6))
        return [o.token_ids for o in eng.generate([[1, 2, 3], [4, 5]], params)]

    plain = run()
    monkeypatch.setattr(spec_step_mod, "target_probs", sampling_kernel.target_probs)
    monkeypatch.setattr(runner_mod, "sample_probs",
                        lambda logits, t, k, p, generator=None, table=None: sampling.sample_probs(
                            logits, t, k, p, generator, table, kernels=True))
    assert run() == plain


@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)], ids=["plain", "chain", "tree"])
def test_seeded_sampling_through_the_kernels_draws_the_same_tokens(monkeypatch, spec):
    """Seeded rows' draws (layers/row_draws.py) feed the kernels' exponential race as the generator's do: through
    the CUDA path's kernels a seeded request draws the tokens the PyTorch path draws."""
    target = tiny_llama(seed=5, vocab=64, hidden=32, layers=2, std=0.35)
    drafter = tiny_drafter(target, seed=6, draft_vocab=None, hidden=32, std=0.35)
    params = [SamplingParams(max_new_tokens=6, temperature=0.9, top_k=20, ignore_eos=True, seed=s) for s in (7, 8)]

    def run() -> list[list[int]]:
        eng = Engine(target, None, EngineConfig(max_batch_size=2, seed=3), drafter=drafter if spec else None,
                     spec=spec)
        return [o.token_ids for o in eng.generate([[1, 2, 3], [4, 5]], params)]

    plain = run()
    monkeypatch.setattr(spec_step_mod, "target_probs", sampling_kernel.target_probs)
    for mod in (runner_mod, draft_mod):
        monkeypatch.setattr(mod, "sample_probs", lambda logits, t, k, p, generator=None, table=None:
                            sampling.sample_probs(logits, t, k, p, generator, table, kernels=True))
    assert run() == plain
