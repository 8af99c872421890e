"""The training features' graph runner (train/feature_graphs.py) on the CPU: its static path (the buffers a CUDA
graph writes into, run eagerly) gives target_features' values as views of shared buffers, which the next call
overwrites, and grows them for a larger batch; the default on the CPU is target_features itself."""

from __future__ import annotations

import torch
from tiny import tiny_llama

from eaglespec.train.feature_graphs import FeatureGraphs
from eaglespec.train.features import target_features
from eaglespec.train.vocab import build_draft_vocab


def _setup():
    target = tiny_llama(seed=0)
    target.set_eagle3_layers_to_capture([1, 2, 3])
    V = target.config.vocab_size
    vocab = build_draft_vocab(torch.arange(V).flip(0), V // 2)
    return target, vocab


def _equal(a, b) -> bool:
    return torch.equal(a.aux, b.aux) and torch.equal(a.probs, b.probs) and torch.equal(a.argmax, b.argmax)


def test_static_path_equals_target_features_through_shared_buffers():
    target, vocab = _setup()
    g = torch.Generator().manual_seed(0)
    fg = FeatureGraphs(target, vocab, vocab.target_to_draft, mode="static")
    fg.reserve(3 * 16)
    a = torch.randint(0, target.config.vocab_size, (3, 16), generator=g)
    b = torch.randint(0, target.config.vocab_size, (2, 8), generator=g)
    fa = fg(a)
    assert _equal(fa, target_features(target, a, vocab))
    assert fa.aux.shape == (3, 16, 3 * target.config.hidden_size) and fa.probs.shape == (3, 16, vocab.size)
    assert fa.probs.data_ptr() == fg.probs.data_ptr() and fg.capacity == 48
    fb = fg(b)
    assert _equal(fb, target_features(target, b, vocab))
    assert fb.probs.data_ptr() == fa.probs.data_ptr()  # the same buffers: the first call's features are overwritten
    assert torch.equal(fa.probs.reshape(-1)[: fb.probs.numel()], fb.probs.reshape(-1))
    # a larger batch grows the buffers
    c = torch.randint(0, target.config.vocab_size, (4, 20), generator=g)
    fc = fg(c)
    assert fg.capacity == 80 and fg.probs.shape[0] == 80
    assert _equal(fc, target_features(target, c, vocab))


def test_default_on_the_cpu_is_target_features_itself():
    target, vocab = _setup()
    fg = FeatureGraphs(target, vocab, vocab.target_to_draft)
    assert fg.mode == "eager" and fg.pool is None
    t = torch.randint(0, target.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
    fg.reserve(100)
    assert fg.probs is None  # no buffers in eager mode
    assert _equal(fg(t), target_features(target, t, vocab))


def test_trainer_sizes_the_buffers_for_its_largest_padded_batch_of_any_set(tmp_path):
    """The trainer reserves the features' buffers once, for the largest padded batch of the training set and of the
    evaluation sets (a larger one later would grow them and drop every graph captured so far)."""
    from collections import Counter

    from eaglespec.train.dataset import TokenDataset, gather_batch, make_batches
    from eaglespec.train.drafter import new_drafter
    from eaglespec.train.trainer import TrainConfig, Trainer

    target, vocab = _setup()
    V = target.config.vocab_size
    g = torch.Generator().manual_seed(2)

    def dataset(lens: list[int]) -> TokenDataset:
        lens_t = torch.tensor(lens)
        offsets = torch.cat((torch.zeros(1, dtype=torch.int64), lens_t.cumsum(0)))
        n = int(lens_t.sum())
        return TokenDataset(torch.randint(0, V, (n,), generator=g), torch.ones(n, dtype=torch.bool), offsets,
                            Counter())

    train, held_out = dataset([5, 6, 7, 9, 12]), dataset([15, 15, 14])
    cfg = TrainConfig(work_dir=str(tmp_path), aux_layers=(1, 2, 3), batch_tokens=48, max_steps=1, progress=False,
                      catch_signals=False)
    tr = Trainer(target, new_drafter(target, (1, 2, 3), vocab), train, held_out, vocab, cfg)
    most = max(gather_batch(ds, ids).tokens.numel() for ds in (train, held_out)
               for ids in make_batches(ds.lengths, 48))
    assert most == 45 and tr.features.capacity == most  # the held-out batch of 3 x 15, above training's 4 x 9
    tr.fit()
    assert tr.features.capacity == most
