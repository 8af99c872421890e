"""The model runner: owns the target, the drafter, their KV caches and the per-row device state, and executes the
three kinds of step as tensor programs (DESIGN.md "One speculative step, as data"):

- `prefill(rows, prompts)`: one batched target forward over right-padded prompts (capturing aux states when
  speculating), the first sampled token, and the drafter's catch-up over the prompt (a CUDA graph per rows and
  length bucket for text prompts that fit one, eager otherwise; prefill_step.py, a part of this class);
- `decode(rows)`: one target token per row;
- `spec_step(rows, greedy, index)`: with speculation shape `shapes[index]`, draft (S-1 drafter forwards over the
  tree frontier), build the tree, verify D tokens in one target forward, accept per row, compact the target KV to
  the accepted path and catch the drafter up (with the largest K of all shapes, so that any shape drafts next).
- `launch(kind, rows, greedy, ahead)` / `collect(pending)`: a decode or speculative step through the graph path, split
  for overlap scheduling: the step and the copy of its results to the host are enqueued without waiting, and the
  host reads them later, after it has launched the next step (`ahead`: positions a still unread step may have added
  to any row, for the key-length bucket).
- `lp=k` on any of them (a step where some request asked for log-probabilities; k <= `max_logprobs`, None: none):
  the step also writes each committed token's packed log-probability row (layers/logprobs.py: the target's raw
  logits at the position that chose it, and its top k alternatives) into `lp_buffer` (engine/logprob_buffer.py);
  launched steps bring them to the host with their tokens (`PendingStep.logprobs`), other steps leave them for
  `logprobs_host(rows, k)`. Steps without it compute nothing more (graphs are keyed by it).
- `step_extras` (set by the engine before a step; graphs are keyed by it): `seeded`, a sampled row draws from its own
  seed (layers/row_draws.py); `adjusted`, rows' logits are adjusted (penalties, logit_bias, min_tokens, min_p:
  engine/row_adjust.py) before every choice the target makes: the prefill's first token, a decode's, and at each
  verified node, for the tokens on that node's draft path; the committed tokens then join the rows' counts. The
  drafter's logits are adjusted too, by the rows' counts as they stand (not each draft path's): a guess closer to
  the target's choice; verification alone decides what is committed. Log-probabilities stay the raw logits' (as
  vLLM reports them).
- `constraint` (set by the engine before a step holding a structured-output request, with `step_extras.constrained`;
  else None): a StepGrammar (step_grammar.py) whose masks restrict the target's choices to the tokens each row's
  grammar allows: the prefill's first token and a decode's by the rows' current states, a verify's nodes by the
  state after each node's draft path. The host computes them and loads them into `grammar_rows`
  (engine/grammar_rows.py), from which the phases read them, so that such steps replay graphs too (keyed by
  `constrained`, their choices split off the target forwards: `_decode_forward` / `_decode_choose`,
  `_verify_forward` / `_verify_accept`): a decode's current masks while its forward runs, a speculative step's
  before its draft (which guides depth 1 by them) and its tree's while its verify's forward runs (the tree's tokens
  copied to the host behind the draft: a second synchronisation, which waits for the draft only; `launch`).
  Drafts are guided by the grammars at depth 1 (from the same buffers); eager steps (no graphs: the CPU, an ungrouped
  MoE) guide every level, reading each level's paths on the host. The engine does not overlap such steps.

Per-row state lives on the device (`seq_len`, `last_token`, `active`; `sampling`, `adjust`: each row's sampling
parameters and logit adjustments; `draft`: the drafter's top-K and hidden, engine/drafter_rows.py); the host keeps
only the committed lengths, which it learns when it reads the accepted lengths: that read is the one
synchronisation of a step. Policy (which rows run, which shape a step takes) is the scheduler's and the
engine's; this class never decides.

Each step is written over explicit tensors with a static key length (`_decode_core`; the speculative step as three
phases `_spec_draft`, `_spec_verify`, `_spec_commit`: spec_step.py, a part of this class). Eagerly it runs on exactly the requested rows with the smallest
key length; on CUDA `GraphCache` (cuda_graphs.py) captures it once per (batch bucket, length bucket, greedy) over rows
0..B-1, and rows of the bucket that hold no running request are kept inert by `active`.
"""

from __future__ import annotations

from typing import Collection, Sequence

import torch

from .. import device_memory
from ..config import SpecConfig
from ..device_memory import gib
from ..errors import DeviceMemoryError

from ..spec_schedule import spec_envelope
from ..layers.commit_kernel import advance_decode
from ..layers.context import ForwardContext, cached_arange, causal_mask
from ..layers.row_draws import DECODE_SITE
from ..layers.sampling import Draws, greedy_ids, sample_probs
from ..layers.token_mask import mask_logits
from ..sampling_params import SamplingParams
from ..spec.draft import catch_up
from .drafter_rows import DrafterRows
from .grammar_rows import GrammarRows
from .grammar_step import GrammarStep
from .kv_cache import KVCache
from .logprob_buffer import LogprobBuffer, columns
from .pending_step import PendingStep, ResultBuffers
from .prefill_step import PrefillStep
from .row_adjust import RowAdjust
from .row_sampling import RowSampling, StepExtras
from .spec_step import SpecStep
from .step_grammar import StepGrammar
from .step_kinds import Rows, shape_index
from .timing import PhaseTimer

class ModelRunner(PrefillStep, SpecStep, GrammarStep):
    def __init__(
        self,
        target: torch.nn.Module,
        drafter: torch.nn.Module | None,
        spec: SpecConfig | Sequence[SpecConfig] | None,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
        cuda_graphs: bool = True,
        prefill_graphs: bool = True,
        max_logprobs: int | None = None,
        prefill_chunk: int | None = None,
    ) -> None:
        self.target, self.drafter = target, drafter
        self.prefill_chunk = prefill_chunk  # longer eager prefills run in windows of this many tokens (prefill_step)
        self.max_logprobs = max_logprobs  # alternatives per token in `lp_buffer`; None: no log-probabilities
        # the speculation shapes a step may take (by index: `spec_kind`); `spec` is their envelope (the largest S, K
        # and D), by which caches, drafter state and headroom are sized, and with whose K the drafter catches up (a
        # step of a smaller K reads the first K of the drafter's top ids, best first)
        shapes = (tuple(spec) if isinstance(spec, (tuple, list)) else (spec,)) if spec is not None else ()
        self.shapes: tuple[SpecConfig, ...] = shapes if drafter is not None else ()
        self.spec = spec_envelope(self.shapes) if self.shapes else None
        self.device, self.dtype = device, dtype
        # On CUDA the default generator is used: CUDA graphs track its state (a private one would need registering).
        self.generator = None if device.type == "cuda" else torch.Generator(device=device)
        # set by the engine before each step: whether a row of it samples with its own seed (SamplingParams.seed;
        # such steps draw through `RowDraws`, layers/row_draws.py) or adjusts its logits; graphs are keyed by it
        self.step_extras = StepExtras()
        self.constraint: StepGrammar | None = None  # set by the engine for steps of structured outputs
        self.grammar_rows: GrammarRows | None = None  # their masks on the device (allocated at the first such step)
        self.reseed(seed)
        self.rows = 0  # cache rows: the steps' rows, then the spare ones (`allocate`)
        self.step_rows = 0
        self.max_len = 0
        self.kv: KVCache | None = None
        self.dkv: KVCache | None = None
        self.host_len: list[int] = []
        self.timer = PhaseTimer(device)
        self.graphs = None
        from .cuda_graphs import GraphCache, capturable

        models = [m for m in (target, drafter) if m is not None]
        if cuda_graphs and device.type == "cuda" and capturable(*models):  # an ungrouped MoE runs eagerly

            self.graphs = GraphCache(self, prefill_graphs=prefill_graphs)

    @property
    def speculative(self) -> bool:
        return self.spec is not None

    @property
    def keeps_free_rows(self) -> bool:
        """Whether a free row's cache entries stay as its last request left them (prefix reuse, scheduler.py): on the
        eager path, whose steps compute exactly their rows; graph steps also run the free rows of their batch
        bucket, inert, writing from position 0."""
        return self.graphs is None

    # --- allocation ---------------------------------------------------------------------------------------------
    def headroom(self) -> int:
        """Cache positions a step may touch past the committed length (verify writes, compaction, drafter scratch)."""
        if self.spec is None:
            return 1
        S, K, D = self.spec.steps, self.spec.topk, self.spec.draft_tokens
        return max(D, S + 1, (S - 1) * K + 1)

    def allocate(self, rows: int, max_len: int, spare: int = 0) -> None:
        """(Re)allocate caches and row state for `rows` sequences of up to `max_len` committed tokens, plus `spare`
        rows past them for requests prefilled ahead (scheduler.py), which steps never cover (`step_rows`)."""
        dev, cfg = self.device, self.target.config
        self._check_room(rows + spare, max_len + self.headroom())  # before any state changes
        self.step_rows = rows
        rows += spare
        self.rows, self.max_len = rows, max_len
        self.cache_len = max_len + self.headroom()
        self.kv = KVCache(cfg.num_hidden_layers, self.target.kv_cache_shapes(), rows, self.cache_len, self.kv_dtype,
                          dev)
        self.seq_len = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.last_token = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.active = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.sampling = RowSampling(rows, dev)  # each row's sampling parameters (and seed)
        self.adjust = RowAdjust(rows, cfg.vocab_size, dev)  # and logit adjustments, allocated on first use
        self.host_len = [0] * rows
        width = self.spec.steps + 1 if self.spec is not None else 1  # tokens a step commits per row, at most
        # committed tokens' packed log-probability rows, written by steps run with lp=k (module docstring)
        self.lp_buffer = LogprobBuffer(rows, width, self.max_logprobs, dev) if self.max_logprobs is not None else None
        self.results = ResultBuffers(rows, width, columns(self.max_logprobs), dev.type == "cuda")  # host copies
        if self.spec is not None:
            # one cache layer per drafter decoder layer (a multi-layer EAGLE-3 drafter; the oracle declares none: 1)
            self.dkv = KVCache(getattr(self.drafter, "num_layers", 1), self.drafter.kv_cache_shapes(), rows,
                               self.cache_len, self.draft_kv_dtype, dev)
            self.draft = DrafterRows(self.drafter, self.shapes, rows, cfg.vocab_size, self.dtype, dev)
        self.grammar_rows = None  # sized to these rows at the next constrained step
        if self.graphs is not None:
            self.graphs.reset()

    @property
    def kv_dtype(self) -> torch.dtype:
        """The target's KV cache dtype: the engine's, unless the target asks for another (`kv_dtype`: the 4-bit CPU
        path keeps bf16 keys and values where its numba kernels run, float32 where its row-wise attention's modules read
        them without a conversion)."""
        return getattr(self.target, "kv_dtype", None) or self.dtype

    @property
    def draft_kv_dtype(self) -> torch.dtype:
        """The drafter's KV cache dtype: the engine's, unless the drafter asks for another (float32 beside a target on
        the 4-bit CPU path: engine/int4_drafter.py)."""
        return getattr(self.drafter, "kv_dtype", None) or self.dtype

    def _check_room(self, rows: int, cache_len: int) -> None:
        """Raise `DeviceMemoryError` when the target's and drafter's caches for `rows` rows of `cache_len` positions
        exceed what the device can still give (`device_memory.room`; the caches being replaced stay allocated while
        the new ones are built, and kept rows are copied across): one sentence instead of an out-of-memory error
        mid-request, with the engine's state unchanged."""
        free = device_memory.room(self.device)
        if free is None:
            return
        need = KVCache.bytes_for(self.target.config.num_hidden_layers, self.target.kv_cache_shapes(), rows, cache_len,
                                 self.kv_dtype)
        if self.spec is not None:
            need += KVCache.bytes_for(getattr(self.drafter, "num_layers", 1), self.drafter.kv_cache_shapes(), rows,
                                      cache_len, self.draft_kv_dtype)
        if need > free:
            raise DeviceMemoryError(
                f"the KV caches for {rows} rows of {cache_len} positions take {gib(need)} and {self.device} has "
                f"{gib(free)} left; lower the batch size (--max-batch-size) or the sequence length (--max-seq-len, "
                "a shorter prompt or max_tokens)")

    def state_tensors(self) -> list[torch.Tensor]:
        """The per-row state a step mutates (snapshotted around graph warm-ups)."""
        out = [self.seq_len, self.last_token] + self.adjust.state()
        return out + (self.draft.tensors() if self.spec is not None else [])

    def row_tensors(self) -> list[torch.Tensor]:
        """Every per-row tensor, each once (a request moving to another row takes its entries along)."""
        out = [self.seq_len, self.last_token, self.active] + self.sampling.tensors() + self.adjust.tensors()
        return out + (self.draft.tensors() if self.spec is not None else [])

    def set_sampling(self, row: int, params: SamplingParams, prompt: Sequence[int] = (),
                     stop_ids: Collection[int] = ()) -> None:
        """A request's sampling parameters and logit adjustments into its row (`stop_ids`: what min_tokens bans)."""
        self.sampling.set(row, params)
        self.adjust.set(row, params, prompt, stop_ids)

    def move_row(self, src: int, dst: int) -> None:
        """A request prefilled ahead in row `src` continues in row `dst` (a free row): the target's and the
        drafter's cache entries of its prompt [0, n) and its row state are copied across, all enqueued (no
        synchronisation), and `src` becomes inert. A step still in flight that computes `dst` for the request that
        left it runs before the copies, in stream order; what it wrote past n is overwritten before any step reads it
        (masks stop at the row's length)."""
        n = self.host_len[src]
        for kv in (self.kv, self.dkv):
            for t in kv.tensors if kv is not None else ():
                t[:, dst, :n].copy_(t[:, src, :n])
        for t in self.row_tensors():
            t[dst].copy_(t[src])
        self.host_len[dst] = n
        self.release(src)

    def release(self, row: int) -> None:
        """A finished request's row becomes inert (length 0, inactive) until a prefill reuses it: two enqueued fills,
        no synchronisation (see `set_sampling`)."""
        self.active[row].fill_(False)
        self.seq_len[row].fill_(0)
        self.host_len[row] = 0

    # --- helpers ------------------------------------------------------------------------------------------------
    def _rows(self, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        t = torch.tensor(list(rows), dtype=torch.int64, device=self.device)
        contiguous = list(rows) == list(range(len(rows)))
        return t, None if contiguous else t

    @staticmethod
    def _count(r: Rows) -> int:
        return r.stop if isinstance(r, slice) else r.shape[0]

    def _draws(self, r: Rows, position: torch.Tensor, site: int) -> Draws:
        """Where a step's draws come from (row_sampling.py): position [B], the rows' committed lengths as it began."""
        return self.sampling.draws(self.generator, r, position, site, self.step_extras.seeded)

    def _sample(self, logits: torch.Tensor, r: Rows, greedy: bool, position: torch.Tensor, site: int,
                committed: torch.Tensor | None = None) -> torch.Tensor:
        """logits [B, V] -> tokens [B]. committed [B]: the rows' committed tokens (prompt included) before this one
        (None: position + 1, a decode step's, computed only where read), by which an adjusted step's logits are
        adjusted first (`RowAdjust.logits`); a constrained step's are masked to what the rows' grammars allow before
        that (slot 0 of `grammar_rows`)."""
        if self.step_extras.constrained:
            logits = mask_logits(logits, self.grammar_rows.allowed(r, 0))
        if self.step_extras.adjusted:
            committed = position + 1 if committed is None else committed
            logits = self.adjust.logits(r, logits, committed, self.sampling.temperature[r])
        if greedy:
            return greedy_ids(logits)
        draws = self._draws(r, position, site)
        return sample_probs(logits, *self.sampling.params(r), draws)[0]

    def _add_counts(self, r: Rows, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """tokens [B, W] committed where valid [B, W] join the rows' output counts, in an adjusted step."""
        if self.step_extras.adjusted:
            self.adjust.count(self._row_index(r), tokens, valid)

    def logprobs_host(self, rows: Sequence[int], k: int) -> torch.Tensor:
        """The packed log-probability rows of the last step that computed them (k alternatives), for these rows:
        [len(rows), S+1, 1 + 2k] on the host (a synchronising copy: for steps already read)."""
        assert self.lp_buffer is not None
        return self.lp_buffer.gather(self._rows(rows)[0], k).cpu()

    def _draft_step(self, r: Rows, ctx_rows: torch.Tensor | None):
        """The drafter forward spec/draft.py calls; in an adjusted step its logits are adjusted as the rows' target
        logits are, by their counts as they stand (`RowAdjust.draft_adjuster`), so that drafts follow the penalties."""
        adjust = (self.adjust.draft_adjuster(r, self.draft.target_ids, self.sampling.temperature[r])
                  if self.step_extras.adjusted else None)

        def step(tokens, hidden, positions, write_index, mask, from_target, logits_index):
            ctx = ForwardContext(positions=positions, write_index=write_index, attn_mask=mask,
                                 kv=self.dkv.layers(), rows=ctx_rows, logits_index=logits_index)
            logits, out = self.drafter(tokens, hidden, ctx, from_target=from_target)
            return (adjust(logits) if adjust is not None else logits), out

        return step

    def _catch_up(self, r: Rows, ctx_rows: torch.Tensor | None, tokens: torch.Tensor, aux: torch.Tensor,
                  start: torch.Tensor | None, lengths: torch.Tensor | None, kv_len: int, at=None) -> None:
        """spec/draft.catch_up over the rows with the envelope's top-K (chains keep their depth-1 logits), and the
        drafter's new state into them."""
        st = catch_up(self._draft_step(r, ctx_rows), tokens, aux, start, lengths, kv_len, self.spec.topk,
                      keep_logits=self.draft.keep_logits(self.step_extras.constrained), at=at)
        self.draft.store(self._row_index(r), st)

    def _row_index(self, r: Rows) -> torch.Tensor:
        """The cache rows of a step's rows as an index tensor [B] (graph steps name rows 0..B-1 by a slice)."""
        return cached_arange(r.stop, self.device) if isinstance(r, slice) else r

    def reseed(self, seed: int) -> None:
        """Sampling draws from `seed` on, as a runner built with that seed draws them: on CUDA the device's default
        generator (the captured graphs read its seed and offset at each replay), else the runner's own."""
        if self.generator is None:
            torch.cuda.manual_seed(seed)
        else:
            self.generator.manual_seed(seed)

    # --- decode -------------------------------------------------------------------------------------------------
    def _decode_core(self, r: Rows, ctx_rows: torch.Tensor | None, kv_len: int, greedy: bool,
                     lp: int | None = None) -> torch.Tensor:
        return self._decode_choose(r, ctx_rows, kv_len, greedy, lp, *self._decode_forward(r, ctx_rows, kv_len))

    def _decode_forward(self, r: Rows, ctx_rows: torch.Tensor | None,
                        kv_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A decode step's target forward: (logits [B, V], aux states or None). A constrained graph step replays it
        apart from `_decode_choose`, so that the host computes the rows' masks while it runs."""
        L = self.seq_len[r]
        ctx = ForwardContext(positions=L[:, None], write_index=L[:, None],
                             attn_mask=causal_mask(L[:, None], kv_len),
                             kv=self.kv.layers(), rows=ctx_rows)
        out = self.target(self.last_token[r][:, None], ctx)
        return out.logits[:, 0], out.aux_hidden

    def _decode_choose(self, r: Rows, ctx_rows: torch.Tensor | None, kv_len: int, greedy: bool, lp: int | None,
                       logits: torch.Tensor, aux: torch.Tensor | None) -> torch.Tensor:
        """The rest of a decode step: the token from the logits [B, V] (masked, adjusted, sampled), the counts and
        log-probabilities, the drafter's catch-up, the rows' advance."""
        B, dev = self._count(r), self.device
        L = self.seq_len[r]
        tok = self._sample(logits, r, greedy, L, DECODE_SITE)
        self._add_counts(r, tok[:, None], self.active[r][:, None])
        if lp is not None:
            self.lp_buffer.store(r, logits, tok, lp)
        if self.spec is not None:  # a plain step of a speculative engine (EngineConfig.spec_max_rows): the drafter
            # takes the pair (target aux at L, the new token at L+1), as a commit of one token would give it
            ones = torch.ones(B, dtype=torch.int64, device=dev)
            self._catch_up(r, ctx_rows, tok[:, None], aux, L, ones, kv_len)
        advance_decode(self.seq_len, self.last_token, self.active, self._row_index(r), tok)  # one kernel on CUDA
        return tok

    @torch.inference_mode()
    def decode(self, rows: Sequence[int], greedy: bool, lp: int | None = None) -> list[int]:
        """One plain decoding step; returns the new token of each requested row (this is the step's sync). A
        constrained step's graphs compute the rows' masks while the target's forward runs (`launch`)."""
        if self.graphs is not None:
            with self.timer.phase("decode"):
                return self.collect(self.launch("decode", rows, greedy, lp=lp))[1]
        if self.constraint is not None:
            self.load_grammar_root(rows)
        Lmax = max(self.host_len[i] for i in rows)
        with self.timer.phase("decode"):
            r, ctx_rows = self._rows(rows)
            out = self._decode_core(r, ctx_rows, Lmax + 1, greedy, lp).tolist()
        for i in rows:
            self.host_len[i] += 1
        return out

    @torch.inference_mode()
    def launch(self, kind: str, rows: Sequence[int], greedy: bool, ahead: int = 0,
               lp: int | None = None) -> PendingStep:
        """Enqueue one "decode" or "spec" step through the graph path and the copy of its results to the host,
        without waiting (see the module docstring). A decode step advances the host lengths now (by one); a
        speculative step's advance is known only when it is read (`collect`). A constrained step (`constraint`)
        loads its rows' masks between its graphs, each computed on the host while the GPU runs a forward: a decode's
        during its target forward (which reads none), a speculative step's tree masks during its verify's forward
        (the tree copied to the host after the draft, waited for then), its current masks before its draft (which
        guides depth 1 by them)."""
        assert self.graphs is not None, "overlapped steps run through the graph path"
        Lmax = max(self.host_len[i] for i in rows) + ahead
        n = max(rows) + 1
        after = self._grammar_hooks(kind, rows) if self.constraint is not None else None
        out = self.graphs.run(kind, n, Lmax, greedy, lp, after=after)  # the graphs' static output buffers
        toks, m = (out[0], None) if kind == "decode" else (out[1], out[0])  # [B] or [B, S+1]; [B]
        lps = self.lp_buffer.head(n) if lp is not None else None  # [n, S+1, W]: rows 0..n-1, contiguous
        steps = 0 if kind == "decode" else self.shapes[shape_index(kind)].steps
        if kind == "decode":
            for i in rows:
                self.host_len[i] += 1
        return self.results.step(list(rows), toks, m, lps, steps, columns(lp))

    def collect(self, pending: PendingStep) -> tuple[list[int] | None, list]:
        """The results of a launched step, per requested row: (None, tokens) for decode, (m, committed tokens) for a
        speculative step, whose host lengths advance now. Waits for that step only, not for later ones."""
        if pending.event is not None:
            pending.event.synchronize()
        toks = pending.tokens.tolist()
        toks = [toks[i] for i in pending.rows]
        if pending.accepted is None:
            return None, toks
        m_all = pending.accepted.tolist()
        m = [m_all[i] for i in pending.rows]
        for i, k in zip(pending.rows, m):
            self.host_len[i] += k + 1
        return m, toks
