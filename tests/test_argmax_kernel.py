"""The two-stage argmax Triton kernel (greedy decoding's token choice on CUDA), run by Triton's interpreter on the CPU,
against torch.argmax (including its first-index rule for ties, across chunks too); and plain and speculative
greedy decoding routed through it still give the same tokens."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain  # noqa: E402

import eaglespec.engine.runner as runner  # noqa: E402
import eaglespec.layers.sampling as sampling  # noqa: E402
import eaglespec.spec.draft as draft  # noqa: E402
import eaglespec.spec.verify as verify  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers.argmax_kernel import CHUNK, argmax_rows, fits  # noqa: E402


@pytest.mark.parametrize("shape", [(3, 1000), (2, 4, 777), (1, 1), (2, 3 * CHUNK + 5), (1, 49152)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_argmax(shape, dtype):
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    ids = argmax_rows(x)
    assert ids.dtype == torch.int64 and ids.shape == shape[:-1]
    assert torch.equal(ids, x.argmax(-1))  # bf16 rows hold ties: the first index wins in both


def test_ties_take_the_first_index_within_and_across_chunks():
    V = 2 * CHUNK + 100
    x = torch.zeros(4, V)
    x[0, [7, 3, CHUNK + 1]] = 5.0  # ties inside chunk 0 and in chunk 1
    x[1, [CHUNK + 9, 2 * CHUNK + 50]] = 1.0  # the first maximum sits in chunk 1
    x[2, [2 * CHUNK + 99]] = 1.0  # the last entry of a partial chunk
    x[3] = float("-inf")  # nothing finite: index 0, as torch.argmax
    assert argmax_rows(x).tolist() == [3, CHUNK + 9, 2 * CHUNK + 99, 0] == x.argmax(-1).tolist()


def test_a_strided_row_view():
    x = torch.randn(6, 2, 5000, generator=torch.Generator().manual_seed(2))[:, 1]  # rows strided by 10,000
    assert torch.equal(argmax_rows(x), x.argmax(-1))
    y = torch.randn(5000, 3, generator=torch.Generator().manual_seed(3)).t()  # last dim not contiguous
    assert torch.equal(argmax_rows(y), y.argmax(-1))


def test_fits():
    assert fits(1) and fits(163_840) and not fits(0) and not fits(1 << 23)


def test_greedy_ids_keeps_torch_argmax_off_cuda():
    x = torch.randn(3, 10)
    assert torch.equal(sampling.greedy_ids(x), x.argmax(-1))


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(2, 2, 5)])
def test_decoding_through_the_kernel_equals_plain(monkeypatch, spec):
    """The engine takes the kernel on CUDA only; here every greedy choice (decode, verify, a chain's drafts) is routed
    through it on the CPU (interpreter): plain decoding and speculation still give torch.argmax's tokens."""
    calls = []

    def through_kernel(logits, table=None, out=None):
        calls.append(tuple(logits.shape))
        return argmax_rows(logits, table, out)

    def route(target, drafter):
        for mod in (runner, verify, draft, sampling):
            monkeypatch.setattr(mod, "greedy_ids", through_kernel)

    assert_transformed_engine_equals_plain(route, spec, [[5, 6, 7, 8], [9, 10]], 12)
    assert calls and any(s[-1] == 50 for s in calls) == (spec.topk == 1)  # chains draft through it (50: draft vocab)
    assert any(s[-1] != 50 for s in calls)  # and the target's choices go through it


@pytest.mark.parametrize("shape", [(3, 1000), (2, 3, 2 * CHUNK + 7)])
def test_a_lookup_table_maps_the_argmax(shape):
    """A drafter's chain takes its draft ids to target ids in the kernel's last stage (`table`): table[argmax]."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(*shape, generator=g)
    table = torch.randperm(5 * shape[-1], generator=g)[: shape[-1]]
    assert torch.equal(argmax_rows(x, table), table[x.argmax(-1)])
    assert torch.equal(sampling.greedy_ids(x, table), table[x.argmax(-1)])  # the CPU path: the same map


def test_out_writes_a_strided_column():
    """A greedy chain's levels write their target ids straight into their column of the candidates ([B, S]); the
    other columns keep their values, on the kernel's path and on the CPU's."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 300, generator=g)
    table = torch.randperm(1000, generator=g)[:300]
    for fn in (lambda lg, t, o: argmax_rows(lg, t, o), sampling.greedy_ids):
        tokens = torch.full((3, 4), -7, dtype=torch.int64)
        got = fn(x, table, tokens[:, 2])
        assert torch.equal(tokens[:, 2], table[x.argmax(-1)]) and got.data_ptr() == tokens[:, 2].data_ptr()
        assert (tokens[:, [0, 1, 3]] == -7).all()
