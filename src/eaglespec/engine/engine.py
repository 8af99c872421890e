"""The engine: requests in, tokens and text out, plain or speculative, for a batch of any mix of prompts.

`Engine(target, tokenizer, config, drafter, spec)` checks, when a drafter is given, that the target implements the
EAGLE-3 protocol (`protocol.require_target`) and that the drafter fits it, wires the target's embedding (and head) into
the drafter, and turns on aux capture. Then:

- `add_request(prompt, params)` / `step()` / `has_work()`: the continuous-batching loop a server drives, and
  `abort(request)` for a request whose client went away (a waiting one leaves the queue; a running one finishes
  with reason "abort" at its next step, freeing its row as a request that ends by itself does);
- `generate(prompts, params)`: a batch to completion, outputs in input order;
- `stream(prompt, params)`: text deltas of one request as they are committed;
- `score(ids, k)`: the log-probability of each prompt token given the ones before it (engine/scoring.py: one
  cache-free target forward, eager, between steps: what an evaluation harness's log-likelihood asks of a server's
  `echo`).

Each `step()` runs one scheduler batch: a prefill of admitted requests, or one decode / speculative step over all
running requests; its only host synchronisation is reading the committed tokens (and, speculating, their count).
A step where some of its requests asked for log-probabilities (`SamplingParams.logprobs`, up to
`EngineConfig.max_logprobs` alternatives) also computes them for every row and reads them with the tokens (5
alternatives while none asks for more, else the engine's most: `layers/logprobs.step_alternatives`); each such
request keeps its tokens' entries (`Request.logprobs`, `GenerationOutput.logprobs`). A step holding a request that
adjusts its logits (penalties, logit_bias, min_tokens, min_p) adjusts every row's (neutral rows keep theirs), and one
holding a seeded sampled request draws through the rows' seeds (`row_sampling.StepExtras`). A request with a
structured output (`SamplingParams.structured`) gets its grammar compiled when it is added (a schema or grammar that
does not compile is the user's error then; grammar/compiler.py); a step holding one masks every choice of the
target by the rows' grammars (`runner.constraint`, step_grammar.py: masks computed on the host, read by the step's
graphs from device buffers) and is not overlapped (its masks need the previous step's tokens).
A speculative engine with `EngineConfig.spec_max_rows` takes plain decode steps while more rows run (the drafter is
kept in step by the decode step itself) and speculative steps again once few enough do. With a `SpecSchedule` as its
`spec` each speculative step takes the shape scheduled for its rows (a chain for a lone request, a tree once several
run) and its mode (a step where any row has a count penalty takes the schedule's penalized entries, else one
where any row samples its sampled entries; either decodes plainly where those are empty); the drafter's state
after any step serves every shape.
With `EngineConfig.overlap` (graph path) a decode / speculative `step()` first launches the next step and then reads
the previous one, so the tokens of a step reach the requests one `step()` later (`has_work()` stays true until the
last launched step is read); a prefill step launches the next step of every running row, the admitted ones included,
before it reads their first tokens, so the device does not wait for the host between an admission and the step after
it (on the H200 that wait was ~0.3 ms per admission: docs/benchmarks.md, "Session 29"). Prefills still wait for the
unread step to be read: a row it writes may just have been freed. Requests prefilled ahead into spare rows
(`EngineConfig.prefill_ahead`, scheduler.py) take freed rows without a prefill: their rows' copies are enqueued behind
the unread step, and the next step launches at once. With `EngineConfig.compact_rows`, once nothing waits, the
requests of a draining batch move into the lowest free rows (after a read, with nothing in flight), so that its steps
replay the smallest graph bucket that holds them. `step_counts` counts the batched steps run by kind
("prefill", "decode", "spec"; a launched overlapped step counts when launched), for benchmarks; an engine of several
shapes also counts its speculative steps per shape ("spec 3,1,4": `spec_schedule.spec_text`); "join" and "compact" count the
requests moved into other rows (no steps of their own). Prefix reuse (finished rows keeping their entries for prompts
that start with them; where it is on, kept across grown caches) is prefix_reuse.py's, a mixin of the same class;
"reused tokens" counts the prompt positions it spared.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

from ..config import EngineConfig, SpecConfig

from ..spec_schedule import SpecSchedule, spec_text
from ..errors import RequestError
from ..grammar.compiler import GrammarCompiler
from ..layers.logprobs import TokenLogprob, step_alternatives
from ..models.eagle3 import check_drafter_fits
from ..protocol import require_target
from ..sampling_params import SamplingParams
from ..spec.stats import SpecStats
from .cuda_graphs import PREFILL_SPLIT_ROWS
from .int4_drafter import use_int4_drafter
from .int4_weights import check_shapes, on_int4_path
from .request import GenerationOutput, Request  # GenerationOutput: Engine.generate's
from .pending_step import PendingStep
from .prompts import Prompt, encode_prompt
from .request_checks import check_params, fit_context
from .row_sampling import StepExtras
from .overlapped_step import OverlappedStep, constrained
from .prefix_reuse import PrefixReuse
from .runner import ModelRunner
from .scheduler import Scheduler
from .scoring import score_prompt
from .step_grammar import StepGrammar
from .step_kinds import shape_index, spec_kind

if TYPE_CHECKING:
    from ..grammar.token_grammar import TokenGrammar
    from ..loading.tokenizer import BaseTokenizer

# EngineConfig.prefill_ahead=None: spare rows of an overlapped graph engine of >= AUTO_PREFILL_AHEAD_ROWS rows (H200,
# MT-bench, session 30: at 8 / 32 rows, prefills 66 -> 16 / 31 -> 10, plain decoding +1.2% / +3.2%, speculation
# +1.1% / +1.9%; 8 spare rows were no better than 4)
AUTO_PREFILL_AHEAD = 4
AUTO_PREFILL_AHEAD_ROWS = 8
SERVE_LEN = 4096  # default cache positions per row for a long-lived engine, unless EngineConfig.max_seq_len says


class Engine(OverlappedStep, PrefixReuse):
    plain_note: str | None = None  # api.load: why draft="auto" decodes plainly after measuring this machine
    cpu_timing_s = 0.0  # api.load: seconds draft="auto" spent timing this CPU's forwards (engine/verify_cost.py)

    def __init__(
        self,
        target: torch.nn.Module,
        tokenizer: "BaseTokenizer | None",
        config: EngineConfig = EngineConfig(),
        drafter: torch.nn.Module | None = None,
        spec: SpecConfig | SpecSchedule | None = None,
    ) -> None:
        self.config = config
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype
        self.target, self.tokenizer = target, tokenizer
        self.target_config = target.config
        # the shapes by rows and mode (one entry for a plain SpecConfig); `spec`: the first greedy entry's shape (a lone
        # greedy request's)
        self.schedule = SpecSchedule.of(spec or SpecConfig()) if drafter is not None else None
        self.spec = self.schedule.entries[0][1] if self.schedule is not None else None
        self.drafter = drafter
        if drafter is not None:
            check_shapes(target, self.schedule.shapes)  # the 4-bit CPU path's widest lossless verify
            self._wire_drafter(drafter)
        self.runner = ModelRunner(target, drafter, self.schedule.shapes if self.schedule else None, self.device,
                                  self.dtype, seed=config.seed, cuda_graphs=config.cuda_graphs,
                                  prefill_graphs=config.prefill_graphs, max_logprobs=config.max_logprobs,
                                  prefill_chunk=config.prefill_chunk)
        self.context_len = min(self.target_config.context_limit, config.max_seq_len or 1 << 30)
        # why the context is shorter than the model's positions, for the too-long-prompt message
        reason = self.target_config.context_limit_reason
        self.context_note = f" ({reason})" if reason and self.context_len == self.target_config.context_limit else ""
        self.scheduler: Scheduler | None = None
        tok_eos = tuple(tokenizer.eos_token_ids) if tokenizer is not None else ()
        self.eos_ids = tuple(dict.fromkeys(tok_eos + tuple(self.target_config.eos_token_ids)))
        self.stats = SpecStats()
        # batched steps run, by kind: "prefill", "decode", "spec" (and "spec S,K,D" per shape of a schedule)
        self.step_counts: Counter[str] = Counter()
        self._next_id = 0
        self._pending: tuple[list[Request], PendingStep] | None = None  # overlap: a launched, unread step
        # structured outputs' grammars over this tokenizer (llguidance is loaded by the first request that asks)
        self._grammars = GrammarCompiler(tokenizer, target.config.vocab_size, self.eos_ids) if tokenizer else None

    # --- construction -------------------------------------------------------------------------------------------
    def _wire_drafter(self, drafter: torch.nn.Module) -> None:
        require_target(self.target)
        ec = drafter.config.eagle
        ids = ec.aux_layer_ids if ec.aux_layer_ids is not None else self.target_config.default_aux_layer_ids()
        if ec.aux_layer_ids is not None and self.config.aux_convention == "vllm" and not ec.aux_ids_fixed:
            ids = tuple(i - 1 for i in ids)  # vLLM: id k = after k layers = output of layer k-1
        embed, head = self.target.get_embed_and_head()
        check_drafter_fits(drafter, self.target_config, embed.shape[0], ids)
        drafter.set_embed_and_head(embed, head)
        self.target.set_eagle3_layers_to_capture(list(ids))
        self.aux_layer_ids = tuple(ids)
        if on_int4_path(self.target):  # the drafter follows the target's 4-bit CPU path
            use_int4_drafter(drafter)

    @property
    def speculative(self) -> bool:
        return self.spec is not None

    # --- prompts ------------------------------------------------------------------------------------------------
    def encode_prompt(self, prompt: Prompt, chat: bool = True, tools: Sequence[dict] | None = None) -> list[int]:
        """Text (chat template applied when `chat` and the tokenizer has one), messages, or token ids -> ids
        (engine/prompts.py; `tools` for the chat template)."""
        return encode_prompt(self.tokenizer, prompt, chat, tools)

    # --- the loop -----------------------------------------------------------------------------------------------
    def reseed(self, seed: int) -> None:
        """Sampling draws from `seed` on, as a fresh engine of `EngineConfig.seed=seed` would draw them for the same
        requests (only between runs: nothing may be in flight). One engine then serves several seeded batches
        without capturing its CUDA graphs again (train/regenerate.py: a seed per shard). The rows' kept prefixes
        are forgotten too (`forget_prefixes`): a fresh engine's requests take rows 0, 1, ... in order, and the
        draws of a step go to its rows in row order."""
        if self.has_work():
            raise RequestError("reseed() while requests run: their draws would mix two seeds")
        self.runner.reseed(seed)
        self.forget_prefixes()

    def reserve(self, rows: int, max_len: int) -> None:
        """Allocate caches for `rows` sequences of `max_len` tokens now (a long-lived engine, a benchmark), so that
        later requests never reallocate (which would also drop captured CUDA graphs)."""
        self._ensure_capacity(rows, min(max_len, self.context_len))

    def warmup(self, batch_sizes: Sequence[int] = (1,), greedy: bool = True, prefill: bool = True,
               logprobs: bool = False, structured: bool = False) -> int:
        """Capture the CUDA graphs of every length bucket for these batch sizes, and (while idle, unless prefill is
        False) the prefill graphs of up to the largest of them prompts (PREFILL_GRAPH_ROWS at most: the multi-row
        ones otherwise capture inside the first request that needs them); no-op without graphs. With `logprobs`
        also the graphs of the same steps computing log-probabilities (the steps of requests that ask for them: both
        of their widths); with `structured` also those of steps holding a structured output
        (`StepExtras.constrained`). Returns the number of graphs captured."""
        graphs = self.runner.graphs
        if graphs is None or not graphs.capture or self.runner.kv is None:
            return 0
        K = self.config.max_logprobs
        # the alternatives a step may compute (layers/logprobs.step_alternatives): a few, or the engine's most
        lps = (None, *sorted({step_alternatives(0, K), K})) if logprobs and K is not None else (None,)
        extras = [StepExtras()]
        if structured:
            self.runner.grammar_buffers()
            extras.append(StepExtras(constrained=True))
        n = 0
        for b in batch_sizes:  # graphs are bucketed by the highest row, not the count
            kinds = {self._step_kind(list(range(b)), greedy, False)}
            if self.speculative and self.config.spec_max_rows is not None:
                kinds.add("decode")  # busy steps decode plainly
            n += sum(graphs.precapture(kind, b, greedy, lp, x) for kind in sorted(kinds) for lp in lps for x in extras)
        if prefill and not self.has_work():
            n += sum(graphs.precapture_prefill(greedy, lp=lp, extras=x, rows=max(batch_sizes, default=1))
                     for lp in lps for x in extras)
        return n

    def _ensure_capacity(self, rows: int, max_len: int) -> None:
        r = self.runner
        if r.kv is not None and r.step_rows >= rows and r.max_len >= max_len:
            return
        if self.has_work():  # a launched step still writes into the caches
            raise RequestError("the engine is busy; cannot grow its caches while requests are running")
        rows = max(rows, r.step_rows)
        max_len = max(max_len, r.max_len)
        ahead = self.config.prefill_ahead
        if ahead is None:
            ahead = AUTO_PREFILL_AHEAD if self.overlapping and rows >= AUTO_PREFILL_AHEAD_ROWS else 0

        def grow() -> None:
            r.allocate(rows, max_len, spare=ahead)
            self.scheduler = Scheduler(rows, min_prefill_rows=self.config.min_prefill_rows, ahead=ahead,
                                       ahead_cap=PREFILL_SPLIT_ROWS)

        self._kept_across(grow)  # rows kept for prefix reuse keep their entries (prefix_reuse.py)

    def prepare(self, prompt: Prompt, chat: bool = True, images: Sequence[object] | None = None,
                tools: Sequence[dict] | None = None) -> tuple[list[int], object]:
        """Prompt ids (placeholders expanded for images; `tools` rendered by the chat template) and the target's
        multimodal inputs (or None): what `add_prepared` queues (a server sizes the request by the ids first)."""
        if not images:
            return self.encode_prompt(prompt, chat, tools), None
        if not hasattr(self.target, "prepare_multimodal"):
            raise RequestError(f"{type(self.target).__name__} does not take images")
        if tools:
            raise RequestError("tools cannot be combined with images on this server")
        return self.target.prepare_multimodal(self.tokenizer, prompt, list(images), chat)

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams = SamplingParams(),
        chat: bool = True,
        images: Sequence[object] | None = None,
        stream: bool = True,
    ) -> Request:
        """Queue one request. `images` (PIL images or paths) need a multimodal target, which provides
        `prepare_multimodal(tokenizer, prompt, images, chat) -> (prompt ids with expanded placeholders, mm_inputs)`
        and `embed_multimodal(input_ids, mm_inputs per row) -> inputs_embeds` (used at prefill). `stream` False:
        nobody reads the text before the request ends, so it is decoded once at the end (`Request`)."""
        ids, mm = self.prepare(prompt, chat, images)
        return self._enqueue(ids, mm, params, stream=stream)

    def add_prepared(self, ids: list[int], mm: object, params: SamplingParams = SamplingParams(),
                     stream: bool = True, grammar: "TokenGrammar | None" = None) -> Request:
        """Queue a request from `prepare`'s output (`add_request` is both in one call). `grammar`: its structured
        output's grammar from `compile_grammar`, compiled beforehand on another thread (a server: a complex schema
        compiles for up to a second, which the engine's loop would otherwise wait for); None: compiled here."""
        return self._enqueue(ids, mm, params, stream=stream, grammar=grammar)

    def _fit(self, n_prompt: int, params: SamplingParams) -> SamplingParams:
        """`params` with max_new_tokens clipped to the context left after a prompt of n_prompt tokens; an empty or
        too long prompt raises the user's error (request_checks.py)."""
        return fit_context(params, n_prompt, self.context_len, self.runner.headroom(), self.context_note)

    def warm_for(self, prompt: Prompt, params: SamplingParams = SamplingParams(), chat: bool = True,
                 images: Sequence[object] | None = None) -> int:
        """Allocate the caches a fresh engine needs for one request of this prompt (and images) and capture the CUDA
        graphs its steps will replay (its length buckets; a text prompt's prefill bucket: prefills with images run
        eagerly) now rather than during its first steps, so that a caller can time the answer apart from the
        start-up (`eaglespec generate`). Returns the number of graphs captured: 0 without graphs, for an engine
        that already holds caches, or for a prompt that the request itself will refuse (empty, too long:
        `add_request` raises the error then). Images are prepared here and again by the request."""
        graphs = self.runner.graphs
        if self.scheduler is not None or graphs is None or not graphs.capture:
            return 0
        ids, _ = self.prepare(prompt, chat, images)
        try:
            params = self._fit(len(ids), params)
        except RequestError:
            return 0
        self.reserve(self.config.max_batch_size, len(ids) + params.max_new_tokens)
        n = self.warmup((1,), params.greedy, prefill=False)
        return n + (0 if images else graphs.precapture_prefill(params.greedy, only=len(ids)))

    def _enqueue(self, ids: list[int], mm: object, params: SamplingParams, stream: bool = True,
                 grammar: "TokenGrammar | None" = None) -> Request:
        check_params(params, self.target_config.vocab_size, self.eos_ids, self.config.max_logprobs)
        params = self._fit(len(ids), params)
        max_new = params.max_new_tokens
        need = len(ids) + max_new
        if self.scheduler is None:
            # first request of a long-lived engine (a server): rows and lengths from the config, not this request
            self._ensure_capacity(self.config.max_batch_size, max(need, min(self.context_len, SERVE_LEN)))
        elif need > self.runner.max_len:
            if self.has_work():
                raise RequestError(
                    f"the prompt ({len(ids)} tokens) plus max_new_tokens ({max_new}) exceed the engine's cache of "
                    f"{self.runner.max_len} positions per sequence (EngineConfig.max_seq_len)"
                )
            self._ensure_capacity(self.runner.step_rows, need)
        assert self.scheduler is not None
        if grammar is None:
            grammar = self.compile_grammar(params)
        req = Request(self._next_id, ids, params, self.eos_ids, self.tokenizer, mm_inputs=mm, stream=stream,
                      grammar=grammar)
        self._next_id += 1
        self.scheduler.add(req)
        return req

    def prepare_grammars(self) -> None:
        """Convert the tokenizer for structured outputs now (a server at start) rather than at the first request
        that asks for one (`GrammarCompiler.warm`)."""
        if self._grammars is not None:
            self._grammars.warm()

    def compile_grammar(self, params: SamplingParams) -> "TokenGrammar | None":
        """A structured-output request's grammar at its start (grammar/compiler.py), or None; safe to call from
        another thread than the one stepping the engine (a request's own grammar, the compiler's caches locked)."""
        if params.structured is None:
            return None
        if self._grammars is None:
            raise RequestError("a structured output needs the model's tokenizer (this engine was built without one)")
        return self._grammars.compile(params.structured)

    def _constrain(self, reqs: Sequence[Request]) -> bool:
        """Set the runner's `constraint` for a step of these requests (in row order); True where one has a grammar."""
        self.runner.constraint = StepGrammar.of([q.grammar for q in reqs], self.target_config.vocab_size, self.device)
        return self.runner.constraint is not None

    def abort(self, req: Request) -> None:
        """Stop `req` (module docstring): a waiting request finishes at once, a running or parked one at the next
        step that reads its tokens (`Request.abort_requested`); a finished one is left as it is."""
        if req.finished:
            return
        req.abort_requested = True
        if self.scheduler is not None and self.scheduler.drop_waiting(req):
            req.append([])  # never admitted: it finishes now

    def has_work(self) -> bool:
        return self._pending is not None or (self.scheduler is not None and self.scheduler.has_work())

    @property
    def overlapping(self) -> bool:
        """Decode and speculative steps are overlapped with the host (EngineConfig.overlap, on the graph path)."""
        return self.config.overlap and self.runner.graphs is not None

    def step(self) -> list[Request]:
        """Run one batch; returns the requests that received tokens."""
        assert self.scheduler is not None
        if self._pending is not None:
            return self._step_overlapped()
        self._join_parked()
        self._compact_rows()
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        reqs, rows = batch.requests, batch.rows
        greedy = all(q.params.greedy for q in reqs)
        lp = self._step_logprobs(reqs)
        self.runner.step_extras = StepExtras.of(q.params for q in reqs)
        # a structured output's masks come from the host in the step: no step is launched ahead of its read
        masked = self._constrain(reqs)
        overlap = self.overlapping and not masked and not constrained(self.scheduler.running)
        if batch.kind == "prefill":
            self.step_counts["prefill"] += 1
            for q in reqs:
                self.runner.set_sampling(q.slot, q.params, q.prompt_ids, q.stop_ids)
            mm = [q.mm_inputs for q in reqs]
            starts = [q.reused for q in reqs] if any(q.reused for q in reqs) else None  # reused prefixes
            if starts is not None:
                self.step_counts["reused tokens"] += sum(starts)
            args = (rows, [q.prompt_ids for q in reqs], greedy, mm if any(m is not None for m in mm) else None, lp,
                    starts)
            if overlap:  # the next step of every running row goes in before the first tokens are read
                launched = self.runner.launch_prefill(*args)
                self._launch_running()
                toks = self.runner.collect_prefill(launched)
                lps = launched.logprobs
            else:
                toks = self.runner.prefill(*args).tolist()
                lps = self.runner.logprobs_host(rows, lp) if lp is not None else None
            lp_rows = lps[:, :1].tolist() if lps is not None else None  # [B][1][W], in the prompts' order
            for i, (q, t) in enumerate(zip(reqs, toks)):
                q.append([t], lp_rows[i] if lp_rows is not None else None)
        else:
            if overlap:
                self._launch_running()
                return []  # its results are read by the next step, once that one is launched
            kind = self._step_kind(rows, greedy, any(q.params.penalized for q in reqs))
            self._count_step(kind)
            if kind != "decode":
                index = shape_index(kind)
                m_host, tok_host = self.runner.spec_step(rows, greedy, index, lp)
                lp_rows = self.runner.logprobs_host(rows, lp).tolist() if lp is not None else None
                self._append_spec(reqs, m_host, tok_host, self.runner.shapes[index].steps, lp_rows)
            else:
                toks = self.runner.decode(rows, greedy, lp)
                lp_rows = self.runner.logprobs_host(rows, lp).tolist() if lp is not None else None
                for i, (q, t) in enumerate(zip(reqs, toks)):
                    q.append([t], lp_rows[i] if lp_rows is not None else None)
        self._release_finished()
        return reqs

    def _step_kind(self, rows: Sequence[int], greedy: bool, penalized: bool) -> str:
        """The step for these running rows (`greedy`: all of them greedy; `penalized`: one has a count penalty):
        "decode" for a plain engine, while more than `EngineConfig.spec_max_rows` rows run, or where the schedule
        decodes such steps plainly (`SpecSchedule.sampled` or `.penalized` = ()); else the speculation shape the
        schedule gives this many rows in this mode ("spec", "spec1", ...: `step_kinds.spec_kind`): rows
        0..max(rows) on the graph path, whose steps cover them all, the rows themselves on the eager path, whose
        steps compute only those (prefix reuse may leave them anywhere: scheduler.py)."""
        limit = self.config.spec_max_rows
        if not self.runner.speculative or (limit is not None and len(rows) > limit):
            return "decode"
        assert self.schedule is not None
        n = max(rows) + 1 if self.runner.graphs is not None else len(rows)
        index = self.schedule.shape_index(n, greedy, penalized)
        return "decode" if index is None else spec_kind(index)

    def _step_logprobs(self, reqs: Sequence[Request]) -> int | None:
        """The alternatives a step of these requests computes per committed token (None: none of them asked)."""
        asked = [q.params.logprobs for q in reqs if q.params.logprobs is not None]
        if not asked:
            return None
        assert self.config.max_logprobs is not None  # checked when the requests were added
        return step_alternatives(max(asked), self.config.max_logprobs)

    def _count_step(self, kind: str) -> None:
        if kind == "decode":
            self.step_counts["decode"] += 1
            return
        self.step_counts["spec"] += 1
        if len(self.runner.shapes) > 1:  # which shape ran, where a schedule has several
            self.step_counts["spec " + spec_text(self.runner.shapes[shape_index(kind)])] += 1

    def _append_spec(self, reqs: Sequence[Request], m_host: Sequence[int], tok_host: Sequence[Sequence[int]],
                     S: int, lp_rows: Sequence | None = None) -> None:
        """Append each request's committed tokens (and their packed log-probability rows, [S+1][W] per request, when
        the step computed them); S: the step's drafter forwards (its shape's steps)."""
        for i, (q, k, toks) in enumerate(zip(reqs, m_host, tok_host)):
            q.stats.add(k + 1, S)  # S drafter forwards: S-1 tree levels and the catch-up
            self.stats.add(k + 1, S)
            q.append(toks[: k + 1], lp_rows[i] if lp_rows is not None else None)

    def score(self, ids: Sequence[int], k: int = 0) -> list[TokenLogprob]:
        """Each prompt token's entry given the tokens before it, with its k best alternatives (engine/scoring.py:
        one cache-free forward; running requests are untouched)."""
        return score_prompt(self.target, ids, k, self.device, self.context_len, self.config.max_logprobs)

    # --- conveniences -------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        chat: bool = True,
        images: Sequence[Sequence[object] | None] | None = None,
    ) -> list[GenerationOutput]:
        """Run a batch to completion; `images[i]` are the images of prompt i (multimodal targets)."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise RequestError(f"{len(prompts)} prompts but {len(plist)} sampling parameter sets")
        imgs = list(images) if images is not None else [None] * len(prompts)
        prepared = [self.prepare(p, chat, im) for p, im in zip(prompts, imgs)]
        need = max(len(ids) + p.max_new_tokens for (ids, _), p in zip(prepared, plist)) if prepared else 1
        self._ensure_capacity(min(len(prompts), self.config.max_batch_size), min(self.context_len, need))
        # the text is read at the end: decoded once per request, not token by token (Request)
        reqs = [self._enqueue(ids, mm, p, stream=False) for (ids, mm), p in zip(prepared, plist)]
        while self.has_work():
            self.step()
        return [q.output() for q in reqs]

    def stream(self, prompt: Prompt, params: SamplingParams = SamplingParams(), chat: bool = True,
               images: Sequence[object] | None = None) -> Iterator[str]:
        """Yield text deltas of one request (other queued requests advance too)."""
        return self.stream_prepared(*self.prepare(prompt, chat, images), params)

    def stream_prepared(self, ids: list[int], mm: object, params: SamplingParams = SamplingParams()) -> Iterator[str]:
        """`stream` from `prepare`'s output (a caller that sized the prompt first, as `eaglespec chat` does, does not
        tokenize it, nor preprocess its images, twice)."""
        req = self.add_prepared(ids, mm, params)
        while not req.finished:
            self.step()
            delta = req.take_delta()
            if delta:
                yield delta
        tail = req.take_delta()
        if tail:
            yield tail
        self.last_request = req

