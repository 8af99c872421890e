"""Structured outputs (grammar/, engine/step_grammar.py): answers held to a grammar, with speculation lossless under
it. A toy grammar over a tiny vocabulary (a rule that depends on the whole path, so that a verify node masked by
the wrong path's state changes answers) checks the engine's masking: greedy speculation equals plain greedy, the
oracle of the constrained answers is accepted in full, sampled speculation keeps the constrained distribution; then
the real thing through llguidance with SmolLM2's tokenizer: JSON schemas, regexes, choices and grammars, their
errors, and the real SmolLM2 with its shipped drafter."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Sequence

import pytest
import torch
from test_spec_greedy import PROMPTS  # (the tiny `target` and `drafter` fixtures: conftest.py)
from test_spec_sampling import N_TOKENS, PROMPT, V, assert_same_distribution, exact_distribution, models  # noqa: F401
from tiny import tiny_drafter, tiny_llama

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.step_grammar import StepGrammar
from eaglespec.errors import RequestError
from eaglespec.grammar import StructuredOutput, TokenGrammar
from eaglespec.grammar.token_grammar import mask_words
from eaglespec.layers.token_mask import allowed_tokens
from eaglespec.sampling_params import SamplingParams
from eaglespec.spec.oracle import OracleDrafter
from eaglespec.spec.tree import DraftTree, ancestor_tables

SPECS = [SpecConfig(3, 1, 4), SpecConfig(4, 1, 3), SpecConfig(5, 4, 8), SpecConfig(6, 8, 32)]
TOY = StructuredOutput("grammar", "toy")  # the toy compiler below ignores what it says
GREEDY = SamplingParams(max_new_tokens=40, structured=TOY)


def spec_id(s: SpecConfig) -> str:
    return f"S{s.steps}K{s.topk}D{s.draft_tokens}"


def toy_allowed(prefix: Sequence[int], vocab: int) -> list[bool]:
    """Token t may follow `prefix` unless it repeats the last token or (7t + sum(prefix)) % 5 == 0: each step bans
    about a fifth of the vocabulary, a different fifth after each path."""
    s, last = sum(prefix), prefix[-1] if prefix else -1
    return [t != last and (7 * t + s) % 5 != 0 for t in range(vocab)]


def pack(allowed: Sequence[bool]) -> torch.Tensor:
    """bool [V] -> int32 [W] words, token t at bit t % 32 of word t // 32 (llguidance's layout)."""
    words = [0] * mask_words(len(allowed))
    for t, ok in enumerate(allowed):
        if ok:
            words[t // 32] |= 1 << (t % 32)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


class ToyGrammar(TokenGrammar):
    def __init__(self, vocab: int) -> None:
        self.vocab, self.tokens = vocab, []
        self.masks = 0  # fill_mask calls

    def fill_mask(self, out: torch.Tensor) -> None:
        self.masks += 1
        out.copy_(pack(toy_allowed(self.tokens, self.vocab)))

    def try_consume(self, tokens: Sequence[int]) -> int:
        for n, t in enumerate(tokens):
            if not toy_allowed(self.tokens, self.vocab)[t]:
                return n
            self.tokens.append(t)
        return len(tokens)

    def rollback(self, n: int) -> None:
        del self.tokens[len(self.tokens) - n:]


class ToyCompiler:
    def __init__(self, vocab: int) -> None:
        self.vocab, self.made = vocab, []

    def compile(self, output: StructuredOutput) -> ToyGrammar:
        self.made.append(ToyGrammar(self.vocab))
        return self.made[-1]


def toy_engine(target, drafter=None, spec=None, **kw) -> Engine:
    eng = Engine(target, None, EngineConfig(max_batch_size=4, **kw), drafter=drafter, spec=spec)
    eng._grammars = ToyCompiler(target.config.vocab_size)
    return eng


def obeys_toy(prompt_free: Sequence[int], vocab: int) -> bool:
    return all(toy_allowed(prompt_free[:i], vocab)[t] for i, t in enumerate(prompt_free))


@pytest.fixture(scope="module")
def toy_refs(target):
    return [o.token_ids for o in toy_engine(target).generate(PROMPTS, GREEDY)]


# --- the toy grammar: the engine's masking -----------------------------------------------------------------------
def test_toy_answers_obey_the_grammar_and_differ_from_free_answers(target, toy_refs):
    free = [o.token_ids for o in Engine(target, None).generate(PROMPTS, replace(GREEDY, structured=None))]
    V = target.config.vocab_size
    assert all(obeys_toy(r, V) and len(r) == 40 for r in toy_refs)
    assert not all(obeys_toy(r, V) for r in free)  # the grammar changed the answers
    assert toy_refs != free


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_greedy_speculation_equals_plain_under_a_grammar(target, drafter, toy_refs, spec):
    eng = toy_engine(target, drafter, spec)
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == toy_refs
    # the oracle of the constrained answers has every draft accepted: node n was masked by its own path's state
    refs = [p + r for p, r in zip(PROMPTS, toy_refs)]
    n = 5 * spec.max_accept + 1
    orc = toy_engine(target, OracleDrafter(target.config, refs), spec)
    assert [o.token_ids for o in orc.generate(PROMPTS, replace(GREEDY, max_new_tokens=n))] == [
        r[:n] for r in toy_refs]
    assert orc.stats.accept_length_mean == spec.max_accept
    # every grammar is back where its answer left it (rolled back after each verify's paths)
    assert [g.tokens for g in orc._grammars.made] == [r[:n] for r in toy_refs]


@pytest.mark.parametrize("spec", [None] + SPECS, ids=["plain"] + [spec_id(s) for s in SPECS])
def test_constrained_steps_take_the_graph_path_losslessly(target, drafter, toy_refs, spec):
    """On the static graph path (CUDA graphs' protocol, on the CPU) constrained prefills, decodes and speculative
    steps run as graphs keyed `constrained`, their masks read from the device buffers (engine/grammar_rows.py): a
    decode's loaded after its forward phase, the verify's node masks after the verify's forward phase, for the
    step's rows among the bucket's (each fails when loaded a phase later: mutation runs). Greedy
    answers equal plain constrained decoding's, with requests ending at different lengths (steps over rows with
    gaps); the oracle of the constrained answers is accepted in full (each node masked by its own path's state, in
    its own row)."""
    from test_static_path import static_engine

    lengths = [64, 17, 29, 8]  # 64: a cache long enough for the prefill graphs' smallest bucket
    params = [replace(GREEDY, max_new_tokens=n) for n in lengths]
    want = [o.token_ids for o in toy_engine(target).generate(PROMPTS, params)]
    assert [w[:40] for w in want] == [r[:n] for r, n in zip(toy_refs, lengths)]
    d = drafter if spec else None
    eng = static_engine(target, d, spec, rows=4, compact_rows=False)
    eng._grammars = ToyCompiler(target.config.vocab_size)
    assert [o.token_ids for o in eng.generate(PROMPTS, params)] == want
    kinds = {k[0] for k in eng.runner.graphs.graphs if k[-1].constrained}
    assert kinds == {"prefill", "spec" if spec else "decode"}
    # the choices split off the forwards, so that the host computes masks while those run
    key = next(k for k in eng.runner.graphs.graphs if k[-1].constrained and k[0] != "prefill")
    phases = [name for name, _ in eng.runner.graphs._phases(*key)]
    assert phases == (["draft", "verify", "accept", "commit"] if spec else ["decode", "sample"])
    if spec is None:
        return
    refs = [p + r for p, r in zip(PROMPTS, toy_refs)]
    orc = static_engine(target, OracleDrafter(target.config, refs), spec, rows=4, compact_rows=False)
    orc._grammars = ToyCompiler(target.config.vocab_size)
    n = 5 * spec.max_accept + 1
    cut = [n, n // 3, n, n // 2]  # row 1 ends first: later steps cover rows 0, 2, 3 of the bucket
    got = orc.generate(PROMPTS, [replace(GREEDY, max_new_tokens=m) for m in cut])
    assert [o.token_ids for o in got] == [r[:m] for r, m in zip(toy_refs, cut)]
    assert orc.stats.accept_length_mean == spec.max_accept


def test_grammar_rows_load_and_read_slots():
    from eaglespec.engine.grammar_rows import GrammarRows

    V = 70
    rows = GrammarRows(5, 3, V, torch.device("cpu"))
    assert rows.allowed(slice(0, 5), slice(0, 3)).all() and not rows.has.any()  # a new buffer allows everything
    a = [bool((t * 5) % 3) for t in range(V)]
    b = [t % 4 == 1 for t in range(V)]
    rows.load([3, 1], torch.stack((pack(a), pack(b)))[:, None], [True, False])
    assert rows.allowed(torch.tensor([3, 1]), 0).tolist() == [a, b] and rows.has.tolist() == [0, 0, 0, 1, 0]
    rows.load([1], torch.stack((pack(a), pack(a)))[None])  # slots 0..1 of row 1; its `has` unchanged
    got = rows.allowed(slice(0, 2), slice(0, 3))  # [2, 3, V] views
    assert got[1, :2].tolist() == [a, a] and got[1, 2].all() and got[0].all() and rows.has.tolist()[1] == 0
    assert rows.allowed(torch.tensor([3]), 0).tolist() == [a]  # other rows untouched


@pytest.mark.parametrize("spec", [None, SPECS[0], SPECS[2]], ids=["plain", "chain", "tree"])
def test_constrained_and_free_requests_share_steps(target, drafter, toy_refs, spec):
    """Free rows keep their answers beside constrained ones, also on the static graph path with overlap and prefill
    ahead, where constrained steps replay graphs keyed `constrained`, unoverlapped, and the others replay theirs."""
    from test_static_path import static_engine

    free = replace(GREEDY, structured=None)
    longer = replace(free, max_new_tokens=60)  # runs on alone: graph steps again
    plain = [o.token_ids for o in Engine(target, None).generate(PROMPTS, [free] * 3 + [longer])]
    params = [GREEDY, free, GREEDY, longer]
    want = [toy_refs[0], plain[1], toy_refs[2], plain[3]]
    d = drafter if spec else None
    assert [o.token_ids for o in toy_engine(target, d, spec).generate(PROMPTS, params)] == want
    static = static_engine(target, d, spec, rows=2, overlap=True, prefill_ahead=1)
    static._grammars = ToyCompiler(target.config.vocab_size)
    assert [o.token_ids for o in static.generate(PROMPTS, params)] == want
    assert any(k[0] != "prefill" for k in static.runner.graphs.graphs)  # the free request's steps took graphs


def verified_paths(monkeypatch) -> list[tuple[int, bool]]:
    """Records (depth, allowed by its row's grammar) of every node below the root of every verified tree, read
    where the runner computes the tree's masks (StepGrammar.tree_bits)."""
    seen: list[tuple[int, bool]] = []
    tree_bits = StepGrammar.tree_bits

    def check(self, tokens, parents):
        for g, toks, pars in zip(self.grammars, tokens, parents):
            for j in range(1, len(toks)):  # node j's path below the root
                path, n = [], j
                while n > 0:
                    path.append(toks[n])
                    n = pars[n]
                if g is not None:
                    taken = g.try_consume(path[::-1])
                    g.rollback(taken)
                    seen.append((len(path), taken == len(path)))
        return tree_bits(self, tokens, parents)

    monkeypatch.setattr(StepGrammar, "tree_bits", check)
    return seen


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("spec", [SPECS[0], SPECS[2], SPECS[3]], ids=spec_id)
def test_drafts_stay_inside_the_grammar(target, drafter, monkeypatch, temperature, spec):
    """An eager constrained step's drafts are guided by the grammar level by level (StepGrammar.draft_paths): every
    draft path the verify sees is one the grammar allows, so no node is wasted on a token it could never accept.
    Graph steps guide depth 1 (from the device buffers, no host read inside the draft): every depth-1 node is
    allowed there."""
    from test_static_path import static_engine

    seen = verified_paths(monkeypatch)
    params = replace(GREEDY, temperature=temperature, seed=3 if temperature else None)
    eng = toy_engine(target, drafter, spec)
    eng.generate(PROMPTS, params)
    assert len(seen) > 20 and all(ok for _, ok in seen)
    assert eng.runner.draft.logits is not None  # a tree engine keeps the depth-1 logits once constrained
    seen.clear()
    static = static_engine(target, drafter, spec, rows=4)
    static._grammars = ToyCompiler(target.config.vocab_size)
    static.generate(PROMPTS, params)
    assert sum(d == 1 for d, _ in seen) > 10 and all(ok for d, ok in seen if d == 1)
    assert any(k[-1].constrained for k in static.runner.graphs.graphs)


@pytest.mark.parametrize("spec", [None, SPECS[0], SPECS[2]], ids=["plain", "chain", "tree"])
def test_grammar_rows_computed_by_the_pool_give_the_same_answers(target, drafter, toy_refs, monkeypatch, spec):
    """A host of more cores computes the rows' masks on a thread pool (step_grammar._each): same answers."""
    import eaglespec.engine.step_grammar as step_grammar

    monkeypatch.setattr(step_grammar, "GRAMMAR_THREADS", 4)
    calls = []
    each = step_grammar._each
    monkeypatch.setattr(step_grammar, "_each", lambda fn, n: (calls.append(n), each(fn, n)))
    eng = toy_engine(target, drafter if spec else None, spec)
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == toy_refs
    assert max(calls) == 4 and step_grammar._pool is not None


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[2]], ids=spec_id)
def test_grammars_with_penalties_logprobs_and_seeds(target, drafter, toy_refs, spec):
    """A grammar beside the other per-request features: with penalties greedy speculation still equals plain
    decoding under both; log-probabilities come for every token; a seeded sampled answer repeats and obeys."""
    V = target.config.vocab_size
    both = replace(GREEDY, frequency_penalty=0.9, repetition_penalty=1.3, logprobs=2)
    plain = toy_engine(target).generate(PROMPTS, both)
    got = toy_engine(target, drafter, spec).generate(PROMPTS, both)
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    assert [o.token_ids for o in plain] != toy_refs  # the penalties changed the answers
    assert all(len(o.logprobs) == len(o.token_ids) and obeys_toy(o.token_ids, V) for o in got)
    seeded = replace(GREEDY, temperature=0.9, seed=11)
    a = toy_engine(target, drafter, spec).generate(PROMPTS, seeded)
    b = toy_engine(target, drafter, spec).generate(PROMPTS[::-1], seeded)[::-1]
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert all(obeys_toy(o.token_ids, V) for o in a)


CHAIN_T1 = SamplingParams(max_new_tokens=N_TOKENS, temperature=1.0, structured=TOY)
SAMPLED = [("chain", SpecConfig(3, 1, 4), CHAIN_T1),
           ("tree-topk5", SpecConfig(3, 3, 8), replace(CHAIN_T1, temperature=0.8, top_k=5))]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-path"])
@pytest.mark.parametrize("name,spec,params", SAMPLED, ids=[c[0] for c in SAMPLED])
def test_sampled_speculation_keeps_the_constrained_distribution(models, name, spec, params, graphs):  # noqa: F811
    """Eagerly drafts are guided at every level; on the graph path at depth 1 only (the deeper levels' q unmasked):
    lossless either way."""
    from eaglespec.engine.cuda_graphs import GraphCache

    target, drafter = models

    def mask(logits: torch.Tensor, prefix: list[int]) -> torch.Tensor:
        ok = torch.tensor(toy_allowed(prefix, V))
        return logits.masked_fill(~ok, float("-inf"))

    exact = exact_distribution(target, params, mask)
    n, rows = 8000, 4000
    eng = Engine(target, None, EngineConfig(max_batch_size=rows, seed=23), drafter=drafter, spec=spec)
    eng._grammars = ToyCompiler(V)
    if graphs:
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n // rows):
        for o in eng.generate([PROMPT] * rows, params):
            counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    assert_same_distribution(counts, exact, n)
    assert sum(eng.stats.hist[2:]) >= 100  # drafts were accepted, so verified nodes were masked by their paths


def test_tree_masks_follow_each_nodes_path():
    """StepGrammar.tree_bits against a fresh grammar per node: node j's mask is the state after its path; a path
    the grammar refuses allows everything; a row without a grammar allows everything."""
    Vt = 70
    # root 0; 1, 2 at depth 1; 3 under 1; 4 under 2; 5 under 3; 6 under 4
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3, 4]] * 2)
    depth = torch.tensor([[0, 1, 1, 2, 2, 3, 3]] * 2)
    g0 = ToyGrammar(Vt)
    g0.tokens = [3, 11]  # the request's answer so far
    first = [t for t in range(Vt) if toy_allowed(g0.tokens, Vt)[t]]
    banned = next(t for t in range(Vt) if not toy_allowed(g0.tokens + [first[1]], Vt)[t])
    tokens = torch.tensor([[11, first[0], first[1], 9, banned, 21, 30]] * 2)
    anc, paths = ancestor_tables(parents, depth, 3)
    tree = DraftTree(tokens=tokens, parents=parents, depth=depth, ancestors=anc, paths=paths, topk=2)
    step = StepGrammar([g0, None], Vt, torch.device("cpu"))
    first_masks = allowed_tokens(step.root_bits(), Vt)
    got = allowed_tokens(step.tree_bits(tree.tokens.tolist(), tree.parents.tolist()), Vt)
    assert got.shape == (2, 7, Vt) and got[1].all() and torch.equal(got[:, 0], first_masks)
    assert g0.tokens == [3, 11]  # rolled back
    node_paths = {0: [], 1: [1], 2: [2], 3: [1, 3], 4: [2, 4], 5: [1, 3, 5], 6: [2, 4, 6]}
    valid = 0
    for j, path in node_paths.items():
        toks = [int(tokens[0, n]) for n in path]
        fresh = ToyGrammar(Vt)
        fresh.tokens = [3, 11]
        if fresh.try_consume(toks) == len(toks):
            assert got[0, j].tolist() == toy_allowed(fresh.tokens, Vt), j
            valid += j > 0
        else:
            assert got[0, j].all(), j  # refused (node 4, and node 6 below it)
    assert got[0, 4].all() and got[0, 6].all() and not got[0, 0].all()
    assert g0.masks == 1 + valid  # the current state's mask once (the decode's and the root's), then each valid node


def test_a_tree_re_chooses_depth_1_only_in_rows_with_a_grammar():
    """`DraftGuide.rows`: a row without a grammar keeps its stored top-K at depth 1 (its stored logits may be older:
    graph steps keep none); with every token allowed, the guided tree equals the unguided one."""
    from eaglespec.spec.draft import DraftGuide, DraftState, draft_tree, topk_logp

    B, K, Vd = 2, 2, 12
    g = torch.Generator().manual_seed(0)
    table = torch.randn(Vd, Vd, generator=g)  # a fake drafter: next-token logits by the current token

    def step(tokens, hidden, positions, write, mask, from_target, logits_index):
        return table[tokens], hidden

    logits = torch.randn(B, Vd, generator=g)
    ids, logp = topk_logp(logits, K)
    stale = logits.clone()
    stale[1] = -logits[1]  # row 1's logits are not the ones its top-K came from
    hidden = torch.zeros(B, 4)
    L = torch.tensor([5, 7])

    def draft(state, guide=None):
        return draft_tree(step, lambda t: t, state, L, 3, K, 16, guide=guide, kernels=False)

    want = draft(DraftState(ids, logp, hidden))
    everything = torch.ones(B, Vd, dtype=torch.bool)
    for paths in (None, lambda paths: torch.ones(B, len(paths[0]), Vd, dtype=torch.bool)):  # graph / eager guides
        guide = DraftGuide(everything, torch.tensor([True, False]), paths)
        got = draft(DraftState(ids, logp, hidden, stale), guide)
        assert torch.equal(got.tokens, want.tokens) and torch.allclose(got.scores, want.scores)
        both = DraftGuide(everything, torch.tensor([True, True]), paths)  # re-chosen from the stale logits: differs
        assert not torch.equal(draft(DraftState(ids, logp, hidden, stale), both).tokens[1], want.tokens[1])


def test_allowed_tokens_unpacks_llguidance_bits():
    allowed = [bool((t * 13) % 7 < 3) for t in range(100)]
    allowed[31] = allowed[63] = True  # bit 31 of a word: the sign bit
    assert allowed_tokens(pack(allowed), 100).tolist() == allowed


# --- llguidance: JSON schemas, regexes, choices and grammars over SmolLM2's tokenizer ----------------------------
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}
REAL = {
    "json_schema": (StructuredOutput.json_schema(PERSON),
                    lambda t: set(json.loads(t)) == {"name", "age"} and 0 <= json.loads(t)["age"] <= 99
                    and list(json.loads(t)) == ["name", "age"]),
    # a random model writes a key until max_tokens: an object begun (SmolLM2's complete ones are tested below)
    "json_object": (StructuredOutput("json_object"), lambda t: t.startswith("{")),
    "regex": (StructuredOutput("regex", r"[a-z]{2,8}@[a-z]{3}\.com"),
              lambda t: re.fullmatch(r"[a-z]{2,8}@[a-z]{3}\.com", t) is not None),
    "choice": (StructuredOutput.choice(["alpha", "beta", "gamma delta"]),
               lambda t: t in ("alpha", "beta", "gamma delta")),
    "gbnf": (StructuredOutput("grammar", 'root ::= "(" [0-9]+ ("+" [0-9]+)* ")"'),
             lambda t: re.fullmatch(r"\(\d+(\+\d+)*\)", t) is not None),
    "lark": (StructuredOutput("grammar", 'start: "yes" | "no" | "it depends"'),
             lambda t: t in ("yes", "no", "it depends")),
}
WIDE_PROMPTS = [[1, 2, 3, 4, 5], [700, 800, 900], list(range(1000, 1030)), [5]]


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_gguf):
    from eaglespec.loading.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="module")
def wide():
    """A tiny random target over SmolLM2's 49,152 tokens, and a drafter of 2,000 of them."""
    t = tiny_llama(seed=3, vocab=49152, layers=2)
    return t, tiny_drafter(t, seed=4, draft_vocab=2000)


@pytest.fixture(scope="module")
def wide_refs(wide, smol_tokenizer):
    eng = Engine(wide[0], smol_tokenizer, EngineConfig(max_batch_size=4))
    return {name: eng.generate(WIDE_PROMPTS, SamplingParams(max_new_tokens=64, structured=out))
            for name, (out, _) in REAL.items()}


@pytest.mark.parametrize("name", list(REAL))
def test_answers_take_the_asked_shape(wide_refs, name):
    """A random model's answers under each kind are what the kind allows, ended by EOS once complete."""
    ok = REAL[name][1]
    for o in wide_refs[name]:
        assert ok(o.text), (name, o.text)
        assert o.finish_reason == "stop" or name == "json_object", (name, o.text)


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[2]], ids=spec_id)
def test_greedy_speculation_equals_plain_under_llguidance(wide, smol_tokenizer, wide_refs, spec):
    eng = Engine(wide[0], smol_tokenizer, EngineConfig(max_batch_size=4), drafter=wide[1], spec=spec)
    for name, (out, _) in REAL.items():
        got = eng.generate(WIDE_PROMPTS, SamplingParams(max_new_tokens=64, structured=out))
        assert [o.token_ids for o in got] == [o.token_ids for o in wide_refs[name]], name
    # the oracle of the JSON answers (their EOS included) is accepted in full: llguidance's masks along draft paths
    refs = [p + o.token_ids + [2] for p, o in zip(WIDE_PROMPTS, wide_refs["json_schema"])]
    orc = Engine(wide[0], smol_tokenizer, EngineConfig(max_batch_size=4), drafter=OracleDrafter(wide[0].config, refs),
                 spec=spec)
    got = orc.generate(WIDE_PROMPTS, SamplingParams(max_new_tokens=64, structured=REAL["json_schema"][0]))
    assert [o.token_ids for o in got] == [o.token_ids for o in wide_refs["json_schema"]]
    assert orc.stats.accept_length_mean > spec.max_accept - 1


def test_smollm2_answers_json_with_its_drafter(smollm2):
    """The real SmolLM2 and its shipped drafter (float32): the constrained answers parse, follow the schema's
    property order, and speculation gives plain decoding's tokens."""
    from eaglespec.assets import default_drafter_path
    from eaglespec.loading.checkpoint import load_model

    drafter = load_model(default_drafter_path(), device="cpu", dtype=torch.float32).model
    prompts = ["Give me a JSON object for a person named Alice who is 30 years old.",
               "Describe a fictional cat as JSON."]
    params = SamplingParams(max_new_tokens=48, structured=StructuredOutput.json_schema(PERSON))
    plain = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=2)).generate(prompts, params)
    assert json.loads(plain[0].text) == {"name": "Alice", "age": 30}
    assert all(REAL["json_schema"][1](o.text) for o in plain)
    spec = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=2), drafter=drafter,
                  spec=SpecConfig(3, 1, 4))
    assert [o.token_ids for o in spec.generate(prompts, params)] == [o.token_ids for o in plain]
    assert spec.stats.accept_length_mean > 1.5
    obj = Engine(smollm2.model, smollm2.tokenizer).generate(
        ["Give a JSON object with your name and favourite colour."],
        SamplingParams(max_new_tokens=64, structured=StructuredOutput("json_object")))[0]
    assert obj.finish_reason == "stop" and isinstance(json.loads(obj.text), dict)


@pytest.mark.parametrize("output,message", [
    (StructuredOutput("regex", "(ab"), r"the structured output's regex does not compile: .*regex parse error"),
    (StructuredOutput("grammar", "root ::= ("), r"the structured output's grammar does not compile: .*Expected"),
    (StructuredOutput.json_schema({"type": "nonsense"}),
     r"the structured output's json schema does not compile: Invalid type: nonsense"),
])
def test_outputs_that_do_not_compile_are_refused_when_added(wide, smol_tokenizer, output, message):
    eng = Engine(wide[0], smol_tokenizer, EngineConfig(max_batch_size=2))
    with pytest.raises(RequestError, match=message):
        eng.add_request([1, 2, 3], SamplingParams(structured=output))
    assert not eng.has_work()  # nothing was queued


def test_an_engine_without_a_tokenizer_refuses_structured_outputs(target):
    with pytest.raises(RequestError, match="a structured output needs the model's tokenizer"):
        Engine(target, None).add_request([1, 2], SamplingParams(structured=StructuredOutput("regex", "a+")))


@pytest.mark.parametrize("make,message", [
    (lambda: StructuredOutput("xml", "x"), r"unknown structured output kind 'xml' \(expected one of json_schema, "),
    (lambda: StructuredOutput.json_schema("{not json"), r"the JSON schema is not valid JSON: Expecting"),
    (lambda: StructuredOutput.json_schema("[1, 2]"), r"a JSON schema must be a JSON object \(got list\)"),
    (lambda: StructuredOutput.choice([]), "the choices of a structured output must be a non-empty list"),
    (lambda: StructuredOutput.choice(["a", ""]), "the choices of a structured output must be a non-empty list"),
    (lambda: StructuredOutput("regex", " "), "the regex of a structured output must be a non-empty string"),
    (lambda: SamplingParams(structured=TOY, ignore_eos=True), "ignore_eos cannot be combined with a structured out"),
    (lambda: SamplingParams(structured=TOY, min_tokens=3), "min_tokens cannot be combined with a structured output"),
    (lambda: SamplingParams(structured=TOY, allowed_token_ids=(1, 2)), "allowed_token_ids cannot be combined"),
    (lambda: SamplingParams(structured={"type": "json_object"}), "structured must be a StructuredOutput"),
])
def test_bad_structured_outputs_are_refused(make, message):
    with pytest.raises(RequestError, match=message):
        make()


def test_kimis_tiktoken_tokenizer_takes_grammars(tmp_path):
    """The tiktoken tokenizer (Kimi-K2.5's) reaches llguidance through its encoding: the first tokens allowed are
    prefixes of the choices, and a finished choice allows only EOS."""
    from test_kimi_tokenizer import write_tiny_tokenizer

    from eaglespec.grammar.compiler import GrammarCompiler

    tok = write_tiny_tokenizer(tmp_path / "kimi")
    vocab, eos = tok.vocab_size, tok.eos_token_ids[0]
    g = GrammarCompiler(tok, vocab, [eos]).compile(StructuredOutput.choice(["numbers 123", "the end"]))
    mask = torch.zeros(mask_words(vocab), dtype=torch.int32)
    g.fill_mask(mask)
    first = allowed_tokens(mask, vocab).nonzero()[:, 0].tolist()
    assert first and all("numbers 123".startswith(tok.decode([t])) or "the end".startswith(tok.decode([t]))
                         for t in first)
    g.commit(tok.encode("the end"))
    g.fill_mask(mask)
    assert allowed_tokens(mask, vocab).nonzero()[:, 0].tolist() == [eos]
