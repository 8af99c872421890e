"""CUDA graphs of the training features' forward (features.py), one per batch shape.

The target's eager forward over a training batch is launch-bound for a small target: SmolLM2-135M's 30 layers are
~500 kernel launches whose host time (19-39 ms a batch of 8 x 1,024 on the H200, depending on the host) is about
twice the ~10 ms of its kernels (session 40, `benchmarks/features_attention_check.py`; session 41,
`benchmarks/train_step_profile.py`). A graph replays them in one launch.

Contract of `FeatureGraphs(target, vocab, target_to_draft, mode=None)`:
- `__call__(tokens [B, T]) -> TargetFeatures`, equal to `target_features(target, tokens, vocab, target_to_draft)`
  (the same kernels, replayed);
- the outputs are views of buffers shared by every shape (`aux` [N, n_aux * Ht], `probs` [N, Vd], `argmax` [N]
  for N >= B * T): a call's features are valid until the next call (the trainer uses them within its step: the
  backward that reads the aux states runs before the next batch's features);
- mode "graphs" (the default on CUDA, for targets without data-dependent shapes: `engine.cuda_graphs.capturable`):
  each new (B, T) runs once eagerly on a side stream (lazy initialisation, the compiled functions' first calls),
  then is captured under `no_grad`; all graphs share one memory pool (each one's intermediates are dead after its
  replay, so replays in any order are safe). Mode "static": the same path through the buffers, run eagerly (the
  CPU tests check the buffers' bookkeeping that way). Mode "eager" (the default elsewhere): `target_features`
  itself, no buffers (on the CPU a copy of the [B, T, Vd] labels would only cost);
- `reserve(n)` sizes the buffers for batches of up to n tokens (B x T); a larger batch grows them and drops the
  graphs captured so far (they write to the old buffers; they are recaptured as their shapes come again).
"""

from __future__ import annotations

import torch

from .features import TargetFeatures, target_features
from .vocab import DraftVocab


class FeatureGraphs:
    def __init__(self, target: torch.nn.Module, vocab: DraftVocab, target_to_draft: torch.Tensor,
                 mode: str | None = None) -> None:
        from ..engine.cuda_graphs import capturable

        self.target, self.vocab, self.t2d = target, vocab, target_to_draft
        self.device = next(target.parameters()).device
        if mode is None:
            mode = "graphs" if self.device.type == "cuda" and capturable(target) else "eager"
        assert mode in ("graphs", "static", "eager"), mode
        self.mode = mode
        self.pool = torch.cuda.graph_pool_handle() if mode == "graphs" else None
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capacity = 0
        self.aux = self.probs = self.argmax = None  # type: ignore[assignment]

    def reserve(self, n_tokens: int) -> None:
        """Buffers for batches of up to n_tokens (B x T) tokens (module docstring)."""
        if n_tokens <= self.capacity:
            return
        self.graphs.clear()  # they write to the buffers being replaced
        self.capacity = n_tokens
        self.aux = self.probs = self.argmax = None  # type: ignore[assignment]  # free the old ones first

    def _allocate(self, aux_width: int, aux_dtype: torch.dtype) -> None:
        n = self.capacity
        self.aux = torch.empty(n, aux_width, dtype=aux_dtype, device=self.device)
        self.probs = torch.empty(n, self.vocab.size, dtype=torch.float32, device=self.device)
        self.argmax = torch.empty(n, dtype=torch.int64, device=self.device)

    @torch.no_grad()
    def _run_into(self, tokens: torch.Tensor) -> None:
        """The features of `tokens` written into the buffers' first B x T rows (what a graph captures)."""
        f = target_features(self.target, tokens, self.vocab, self.t2d)
        n = tokens.numel()
        if self.aux is None:
            self._allocate(f.aux.shape[-1], f.aux.dtype)
        self.aux[:n].copy_(f.aux.reshape(n, -1))
        self.probs[:n].copy_(f.probs.reshape(n, -1))
        self.argmax[:n].copy_(f.argmax.reshape(n))

    def _views(self, B: int, T: int) -> TargetFeatures:
        n = B * T
        return TargetFeatures(aux=self.aux[:n].view(B, T, -1), probs=self.probs[:n].view(B, T, -1),
                              argmax=self.argmax[:n].view(B, T))

    def __call__(self, tokens: torch.Tensor) -> TargetFeatures:
        if self.mode == "eager":
            return target_features(self.target, tokens, self.vocab, self.t2d)
        B, T = tokens.shape
        self.reserve(B * T)
        if self.mode == "static":
            self._run_into(tokens)
            return self._views(B, T)
        entry = self.graphs.get((B, T))
        if entry is None:
            entry = self._capture(tokens)
        graph, static = entry
        static.copy_(tokens)
        graph.replay()
        return self._views(B, T)

    def _capture(self, tokens: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        from ..engine.cuda_graphs import no_gc

        static = tokens.clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # eager warm-up: lazy init, compiled functions, the buffers
            self._run_into(static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with no_gc(), torch.cuda.graph(graph, pool=self.pool):
            self._run_into(static)
        self.graphs[tuple(tokens.shape)] = (graph, static)
        return graph, static
