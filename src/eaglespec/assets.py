"""Files shipped inside the package: the trained EAGLE-3 drafter of the embedded default model, and the policy for
using it.

`draft="auto"` on the embedded model speculates with the shipped drafter in the shape `default_spec(device_type,
max_batch_size, temperature, dtype)` gives, a measured choice per device type, engine size, greedy vs sampled decoding
and (greedy on CUDA) bf16 vs float32 (docs/benchmarks.md, "The shipped drafter"), and decodes plainly where every
measured shape was slower than plain decoding (`default_spec` returns None; `slower_note` says what was measured). On
the CPU the target's few-token forwards are timed on the machine at load and decide (`cpu_sizes`, `cpu_choice`):
greedy steps take the shape of CPU_GREEDY_TAUS that a cost model (tau / the step's cost in one-token forwards) rates
fastest where it promises at least CPU_MIN_GREEDY_SPEEDUP; sampled steps the first of their shapes whose forward costs
at most CPU_MAX_VERIFY_COST_SAMPLED one-token forwards; else they decode plainly, and the engine says why.
An explicit shape (`--steps/--topk/--draft-tokens`, `api.load(spec=...)`) always speculates.

The embedded model is recognised by content (`loading.default.is_default_model`: `--model PATH` naming that GGUF, or a
copy of it, is the embedded model), and so is the shipped drafter (`is_default_drafter`: `--draft DIR` naming it, or
a copy of it), which then takes `auto`'s shapes (on the CPU timed as for `auto`) but speculates where `auto` would
decode plainly, since the user asked for it (`cpu_choice(speculate=True)`).
"""

from __future__ import annotations

import filecmp
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .config import SpecConfig

from .spec_schedule import Entries, SpecSchedule, spec_envelope

if TYPE_CHECKING:
    from .sampling_params import SamplingParams

ASSETS = Path(__file__).parent / "assets"
DEFAULT_DRAFTER = ASSETS / "smollm2-135m-eagle3"

# Measured with `eaglespec bench` / `eaglespec tune` on MT-bench first turns, the fifth drafter (docs/benchmarks.md,
# "The shipped drafter", "Session 7" to "Session 12"); the sixth (session 36: the fifth continued on new data, same
# shape and vocabulary, tau 0.02-0.10 higher in every shape measured), the seventh (session 38: the sixth
# continued so, tau 0.02-0.07 higher), the eighth (session 39: tau 0.02-0.09 higher), the ninth (session 43:
# tau 0.00-0.09 higher) and the tenth (session 44: tau 0.01-0.07 higher) keep these shapes, not re-tuned:
# - this project's 2-core CPU, float32: a forward of up to 3 tokens costs about one of 1 token (4 cost 1.5x: MKL
#   leaves its small-M path), so short chains are the fastest shapes at batch 1: greedy, the chain of 2 (3 tokens;
#   1.46x, S1 K1 D2 1.37x, S3 K1 D4 1.15x, tree S2 K2 D4 1.24x; `generate` 1.40x against 1.31x with S1 K1 D2);
#   sampled at temperature 1, the one-step chain (1.15x; S2 K1 D3 1.01x: sampled drafts are accepted less often,
#   0.37 against 0.53 at depth 1, so a second drafter step costs more than it brings);
#   nothing pays with 2 rows (4+ tokens per step: 68 vs 44 ms, step_anatomy.py): engines of one row only;
# - the H200, bfloat16, CUDA graphs with overlap and the Triton kernels (session 11, the short-query attention kernel
#   serving up to 32 rows, the two-kernel top-k): at 1 row the chain of 3 (1.61x; tree S4 K4 D16 1.50x); at 8 rows
#   the tree S4 K4 D16 (continuous batching 1.77-1.81x against the chain's 1.67-1.74x; static batches 1.67x / 1.55x;
#   the tune grid, MT-bench 1-40, 1.73x / 1.62x, S4 K1 D5 1.70x); at 16 rows the two tie (1.68x / 1.70x); at 32 rows
#   the chain of 3 (continuous 1.55-1.70x against the tree's 1.39-1.51x; static 1.37x / 1.18x, the chain 1.44x once
#   32-row prefills ran as graphs): the tree's 16-token verify costs more once 32 rows share a step. Larger engines
#   are unmeasured. Session 12 (programmatic dependent launch: plain one-row decoding 35% faster) kept the shapes: at 1
#   row the chain 1.32x (tree 1.13x), at 8 rows the tree 1.75x (chain 1.69x), at 32 rows the chain 1.59x (tree 1.32x);
#   session 13 (the tree's bookkeeping as kernels, few-row steps one program per row) too: at 1 row the chain 1.45x
#   (tree 1.18x), at 8 rows the tree 1.56x (chain 1.39x; plain 8-row decoding got 23% faster), at 32 rows the chain
#   1.60x (tree 1.42x); engines of several rows take these shapes as a schedule, step by step by the rows running;
#   session 14 (steps of 9-64 rows on the tensor-core kernel: a 128-row verify keeps cuBLAS) made the chain the
#   shape at every size: at 1 row the chain 1.45x (80/80 answers identical to plain decoding; tree S4 K4 D16 1.50x,
#   16/80), at 8 rows the chain 1.70-1.75x (S5 K2 D8 1.73x, S4 K2 D8 1.72x, tree S4 K4 D16 1.54-1.58x), at 32 rows
#   the chain 1.17-1.24x (tree 1.16-1.18x; plain 32-row decoding got 25% faster);
#   session 15 (the drafter's input in one kernel, causal masks in one kernel): at 1 row the chain 1.54-1.57x (tree
#   1.56x), at 8 rows the chain 1.75-1.82x and S5 K2 D8 1.75-1.81x (5 and 3 runs), at 32 rows S5 K2 D8 1.28-1.31x
#   against the chain's 1.18-1.27x (4 and 5 runs): engines of more than 16 rows take S5 K2 D8 for steps whose rows
#   reach past 16, where the chain's verify (4 tokens a row, > 64 rows) leaves the tensor-core kernel for cuBLAS as
#   the tree's does (rows 9-31 are not measured; 16 is that boundary);
#   session 16 (a step's tokens detokenized once, prompts through the Triton attention kernel) made the chain the
#   shape at every size again: at 32 rows the chain 1.32-1.40x against S5 K2 D8's 1.27-1.33x (3 runs each, the chain
#   ahead in every one), at 8 rows the chain 1.83-1.85x and S5 K2 D8 1.81-1.86x, at 1 row the chain 1.61x;
#   session 18 (norms folded into cuBLAS projections past 64 rows) kept it: at 1 row the chain 1.65x, at 8 rows the
#   chain 1.78-1.80x and the tree S4 K4 D16 1.78x (its 128-row verify gained most), at 32 rows the chain 1.39-1.45x;
#   session 19 (the RoPE + KV-store kernel one program per token) retuned on the folded path, and the shape now
#   follows where its verify runs: the K = 2 tree S4 K2 D8 at 2-8 rows (its verify of <= 64 rows on the tensor-core
#   kernel; static 2 / 4 rows 1.61x / 1.56x against the chain's 1.51x / 1.53x; continuous 8 rows 1.81-1.87x in 7 runs
#   against the chain's 1.77-1.81x, S5 K2 D8 1.83-1.89x), the chain at 9-16 rows (the tree's verify has left that
#   kernel, the chain's has not: 12 rows 1.75x against 1.63x, 16 rows 1.75x / 1.77x against 1.60x / 1.62x), the tree
#   again at 17-32 (both verifies on cuBLAS: 20 / 24 / 28 rows tie within the order effect, 1.54-1.55x / 1.36-1.42x /
#   1.47-1.50x; 32 rows 1.41-1.54x, mean 1.49x, in 9 runs against the chain's 1.40-1.44x, S4 K4 D8 1.42-1.54x, S5 K2
#   D8 1.43-1.46x; D = 6 / 10 lost there: 1.36x / 1.41x); at 1 row the chain (1.71x, S6 K2 D10 1.60x, S4 K2 D8 1.55x);
#   session 25 (the short-query attention in blocks of 128 positions: plain decoding 4-6% faster) retuned the trees:
#   at 2-8 rows S4 K4 D8 (8 rows 1.79-1.82x in 4 runs, mean 1.81x, against S4 K2 D8's 1.75-1.79x in the same runs;
#   2 / 4 rows 1.70x / 1.76x against 1.69x / 1.74x), at 17-32 rows S5 K2 D8 (32 rows 1.48-1.51x in 4 runs against
#   S4 K2 D8's 1.43-1.50x in the same runs; S4 K4 D8 1.45x / 1.48x, S5 K4 D8 and S6 K2 D10 1.38-1.46x);
#   session 27 kept both: at 16 rows the chain 1.66x against trees 1.56-1.62x (S4 K2 D6 / K4 D8 / K2 D8, S5 K2 D8 /
#   D7); at 32 rows S5 K2 D7 averaged 1.49x against S5 K2 D8's 1.48x over 6 runs each (0.7%, inside one shape's
#   spread in one call), S6 K2 D8 / D9, S5 K3 D8, S4 K2 D7 / D6, S5 K2 D6, S4 K4 D7 1.31-1.47x;
#   session 65 (H100; a step of 5 rows on the row grid again, `norm_linear_kernel.DOT_MIN_ROWS` 5 -> 6) made the
#   one-row shape the chain of 4, S4 K1 D5: MT-bench at 1 row 3,912-3,915 tok/s (1.75x, tau 2.80, 80/80 answers
#   identical to plain decoding's, as its 5-token verify computes each row as a one-row step does) against the chain
#   of 3's 3,849-3,857 (1.72x, tau 2.56, 80/80) in the same two runs; S5 K1 D6 (tau 3.00, a 6-token verify on tensor
#   cores) 3,770-3,772 (1.68-1.69x, 19/80); on tensor cores S4 K1 D5 had run 3,785 (1.69x, 19/80). Session 66
#   (H200, MT-bench 80, 256 tokens, continuous batching, two runs each): at 12 rows the chain of 4 31,018 / 31,103
#   tok/s (2.03-2.04x, tau 2.83, 80/80) against the chain of 3's 28,972 / 29,074 (1.90-1.91x, 80/80); at 16 rows
#   33,454-33,528 (1.79x, 17/80: its 80-row verify passes `norm_linear_kernel.MAX_ROWS` = 64, to cuBLAS) against
#   35,431-35,480 (1.89x, 80/80): so the chain of 4 takes 9-12 rows too (bucket 12: a 60-row verify), and with it
#   `auto` at 12 rows ran 30,931 / 30,940 (2.03x, 79/80) against the fixed chain of 3's 29,010-29,086. The committed
#   one-row default: 4,086 / 4,103 tok/s (1.77x, tau 2.80, 80/80) against the chain of 3's 4,035 / 4,042 (1.75x).
#   Sampled at temperature 1 (one row, seed 0) the chain of 4 lost, 2,491-2,494 (1.11x, tau 1.87) against 2,604-
#   2,606 (1.16x, tau 1.82), so sampled steps keep the chain of 3; the chain of 3 keeps 13-16 rows.
# - sampling at temperature 1 (the drafter learnt the target's greedy text; chains draw sampled drafts): the CPU's
#   one-step chain gains (1.15x, tau 1.37); on the H200 sampling lost until session 20 (the chain of 3 0.82x, tau
#   1.75: a sampled step sorted every row of logits, ~55 kernels per call), when `target_probs` became one Triton
#   kernel per row (layers/sampling_kernel.py): MT-bench, continuous batching, at temperature 1 the one-step chain
#   1.09x / 1.13x / 0.95x at 1 / 8 / 32 rows (the chain of 3 0.97x / 1.09x / 0.85x), at temperature 0.7 both chains
#   1.17x at 1 row, 1.25x / 1.31x (S1 K1 D2 / S3 K1 D4) at 8 and 1.25x / 1.23x at 16 rows: the one-step chain for
#   sampled engines of up to 8 rows (it gains at both temperatures there), plain decoding above. Session 21 made
#   the sampled verify's acceptance two kernels (layers/sampled_chain_kernel.py) and spread unfiltered rows of
#   `target_probs` over programs: plain sampled decoding +17% / +11% / +7% at 1 / 8 / 32 rows (temperature 1), and
#   S1 K1 D2 / S3 K1 D4 at temperature 1 1.14x / 1.04x (1 row), 1.16x / 1.17x (8), 1.15x / 1.12x (32); at 0.7
#   1.22x / 1.27x, 1.33x / 1.45x, 1.08x / 1.10x: the one-step chain at 1 row, the chain of 3 at 2-32 rows (an
#   8-row engine of that schedule: 1.22x / 1.43x). A 32-row schedule of S1 at 9-32 rows measured 0.87x / 0.78x:
#   steps narrower than the engine's widest shape lost the host/device overlap (a strided pinned copy, fixed since,
#   not re-measured), so at 9-32 rows the policy takes the widest shape, whose steps were measured (1.12x / 1.10x).
#   Session 24 (after session 22's draws inside the distribution kernels and session 23's top-p / top-k kernel), one
#   row, S1 K1 D2 against S3 K1 D4: temperature 1 1.15x / 1.17x, 1 with top-p 0.95 1.20x / 1.26x, 1 with top-p 0.9
#   1.20x / 1.28x, 0.85 1.20x / 1.29x, 0.7 with top-p 0.9 1.28x / 1.46x (and 1.37-1.39x / 1.52x at 8 rows, 1.15-1.18x
#   / 1.24-1.26x at 32): the chain of 3 now leads at one row too, so sampled CUDA engines take it at 1-32 rows.
# On the CPU that first premise is the machine's: session 18's 2-core machine (an AMD EPYC) ran a 3-token forward at
# 1.64-1.80x a 1-token one (MKL's few-row GEMMs through F.linear), and there the chain of 2 ran at 0.99x in `generate`
# (6 MT-bench questions, 128 tokens) and 0.90x in the bench (MT-bench 1-10). Session 19 computes the CPU's
# projections weight-major (layers/cpu_linear.py; fused q/k/v and gate/up on the CPU too): there a forward of 2-4
# tokens costs 1.01-1.07x one of 1 token, plain decoding runs 13.4 tok/s (11.7 unfused) and the greedy shapes on
# MT-bench 1-10, 64 tokens: the tree S2 K2 D4 1.45x (tau 1.88; unfused 1.50x), S2 K1 D3 1.36x, S3 K1 D4 1.34x,
# S3 K2 D6 1.21x, S4 K1 D5 1.19x, S4 K2 D8 1.15x: the tree S2 K2 D4 is the CPU's greedy shape (`generate` 1.59x);
# with 2 rows (8 tokens a verify, 1.49x a one-token forward) S2 K2 D4 ran at 1.00x and S2 K1 D3 at 0.96x: CPU
# engines of several rows still decode plainly. Sampled at temperature 1, the one-step chain still leads (1.15x; S2 K1
# D3 1.08x, S2 K2 D4 0.96x). Session 24 (the same bench, each run in one process: S1 K1 D2 / S2 K1 D3 / S2 K2 D4):
# temperature 1 1.17x / 1.23x / 1.16x and (S1, S2 K1 D3 only, in reverse order) 1.23x / 1.25x, 0.85 1.23x / 1.23x /
# 1.17x, 0.7 with top-p 0.9 1.26x / 1.32x / 1.35x: the chain of 2 at least ties the one-step chain everywhere and is
# within 2% of the best, so sampled one-row CPU engines take it.
# A CPU engine takes the CPU shapes only where its own target's forwards of the shapes' draft_tokens, measured when it
# is loaded (engine/verify_cost.py: ~1.1 s on a machine's first load, ~0.4 s then none on later ones, which keep the
# rounds), make them pay: sampled shapes (and greedy ones without taus here) where a forward costs at most
# `cpu_max_verify_cost(temperature)` one-token forwards; greedy ones, until session 68 by limits too, now by the
# estimate below. The limits come from speedup ~ tau / (ratio + 0.3) (the drafter's and the bookkeeping's ~0.3 of a
# step; session 18's fit), each leaving ~1.1-1.15x. Session 43's machine (2 cores, plain decoding 26 tok/s) tested that
# model: the ratio was 1.22-1.42 for 4 tokens (median ~1.3) and ~1.27 for 3 over fresh processes; with the ninth drafter
# the greedy S2 K2 D4 ran at 1.35x (tau 2.08; the model: 1.30x) and the sampled chain of 2 at temperature 1 at 1.01x
# (tau 1.69; the model: 1.08x). So greedy: tau ~2.08 -> 1.5 (until session 43 a single 1.3, made for tau 1.84, which
# turned speculation off in 2 of 6 `generate` runs there while it paid 1.35x); sampled: tau ~1.7 -> 1.2.
# Session 61 gave the CPU's projections of 3+ rows oneDNN's packed weights (layers/cpu_linear.py): on its 2-core AMD
# EPYC a forward of 6 tokens cost ~1.15-1.3x one of 1 token instead of ~1.5-1.8x, and on MT-bench 1-8 (96 tokens, five
# alternating rounds) the tree S3 K2 D6 (tau 2.23) ran at a median 1.54x against S2 K2 D4's 1.46x (tau 2.01), ahead in
# every round by 4-8% (S4 K2 D8, tau 2.35, and S3 K2 D7 slower in other runs); without the packed weights S3 K2 D6 ran
# 0.94-1.02x, S2 K2 D4 1.2x (docs/benchmarks.md, "Session 61"). So the greedy CPU shape became S3 K2 D6 where a 6-token
# forward cost at most 1.3x (by the model above: 2.23 / (1.3 + 0.3) = 1.39x, while S2 K2 D4 at a ratio under it leaves
# about 2.01 / 1.6 = 1.26x), else S2 K2 D4 under CPU_MAX_VERIFY_COST (until session 68). Sampled at temperature 1
# (MT-bench 1-8, 96 tokens, two rounds, packed): the chain of 2 1.23x (tau 1.65), the one-step chain 1.31x (tau 1.44),
# the chain of 3 1.21x; there a 3-token forward measured ~1.25x a 1-token one, over CPU_MAX_VERIFY_COST_SAMPLED, so
# sampled engines decoded plainly: where the chain of 2's forward is too dear the one-step chain (2 tokens, ~1.0x) is
# timed next. Session 67 (an Intel Xeon whose F.linear now serves 3-row steps: a 3-token forward ~1.15x, so the chain of
# 2 passes): MT-bench 1-6, 64 tokens, one process, three rounds: at temperature 0.7 with top-p 0.9 the chain of 2 1.36x
# against the one-step chain's 1.15x, at temperature 1 1.14x against 1.22x (docs/benchmarks.md, "Session 67"; session
# 61's EPYC at temperature 1: 1.23x against 1.31x). So the chain of 2 stays first for sampled steps in general (one
# sampled shape serves every temperature of an engine's requests), and the one-step chain goes first where every request
# of the engine is known to sample unfiltered at CPU_ONE_STEP_FIRST_TEMPERATURE or hotter (`generate`, `chat`, `bench`:
# `api.auto_spec`'s `only`; no top-p, top-k or min-p, which sharpen the distribution toward the drafter's greedy text,
# where the chain of 2 led).
# Session 68 chose the greedy CPU shape by that model instead of by two limits: on session 67's Xeon (3 tokens on
# F.linear at ~1.1x, 4 at ~1.35x, 6 at ~1.43x, `verify_cost_ratios`) the limits took S2 K2 D4 (6 tokens over 1.3x) while
# the chain of 2 ran fastest in every round (MT-bench 1-6, 64 tokens, three rounds in one process, medians: S2 K1 D3
# 1.46x (1.44-1.56x, tau 1.91), S2 K2 D4 1.33x (2.04), S3 K2 D6 1.26x (2.29), S3 K1 D4 1.21x (2.06)). Those runs put a
# step's cost beyond its verify forward (tau / speedup - ratio(D), in one-token forwards) at 0.20- 0.21 for the two
# 2-step shapes and 0.30-0.39 for the 3-step ones (`bench`'s draft share grew from 6% to 9-10% of a step with the third
# drafter step), so a step costs ratio(D) + 0.05 + 0.08 S and speculation gains tau / that: S2 K1 D3 1.91 / (1.1 + 0.21)
# = 1.46 (measured 1.46x), S2 K2 D4 2.04 / 1.54 = 1.32 (1.33x), S3 K2 D6 2.29 / 1.72 = 1.33 (1.26x). On session 61's
# EPYC (3 / 4 / 6 tokens ~1.26 / 1.24 / 1.27x) it ranks S3 K2 D6 first (1.43 against S2 K2 D4's 1.39: measured 1.54x /
# 1.46x), on session 43's machine (4 tokens ~1.3x) it gives S2 K2 D4 1.38 (measured 1.35x). `cpu_choice` takes the
# greedy shape of CPU_GREEDY_TAUS (the shipped drafter's taus, this bench) with the highest such estimate where it
# reaches CPU_MIN_GREEDY_SPEEDUP (a margin for the model's ~5-8% error: S2 K2 D4 speculates up to a 4-token ratio of
# ~1.56, where the old limit was 1.5), else the engine decodes plainly and says why.
CPU_ONE_STEP_FIRST_TEMPERATURE = 1.0
# The 4-bit CPU path (`--cpu-weights q4`, engine/int4_weights.py; session 69, MT-bench 1-4 / 1-6, 48 / 64 tokens,
# two cores): its one-token step costs about half float32's while a few-token verify (the 4-bit kernel is
# compute-bound past one row; the attention a query row at a time) and the bf16 drafter do not shrink alike: on an
# Intel Xeon with AMX (torch 2.11) speculation ran 0.85x / 0.87x / 0.69x (S1 K1 D2 / S2 K1 D3 / S3 K2 D6) of its plain
# 42.6 tok/s, on an AVX2 AMD EPYC 1.03-1.18x of its plain 16.6-18.1. Session 70 (an AVX-512 AMD EPYC, Zen 4; MT-bench
# 1-6, 64 tokens, three runs): plain 55-62 tok/s, S1 K1 D2 1.03-1.19x (median 1.14x, tau 1.58), S2 K1 D3 1.00-1.17x
# (1.14x, 1.91), the trees S2 K2 D4 0.89-1.08x and S3 K2 D6 0.64-0.83x (a tree's verify gathers its keys a query row
# at a time); its chains' forwards timed as verifies (`verify_cost_ratios(as_verify=True)`) 1.18x / 1.34-1.37x / 1.52x
# a decode step's for 2 / 3 / 4 tokens. So a step there costs ratio(D) + 0.10 + 0.11 S decode steps (the two chains'
# medians: 1.58 / 1.14 - 1.18 = 0.21, 1.91 / 1.14 - 1.355 = 0.32), and the 4-bit path's greedy steps choose among the
# chains by that model (INT4_GREEDY) where it promises at least 1.05x (a shape estimated 1.14x ran 1.00-1.19x).
# Session 71 (the same CPU): the layers' steps through numba kernels (engine/int4_step.py) made plain decoding ~1.4x
# faster (bench, MT-bench 1-6, 64 tokens, two rounds: 82.4 tok/s) while the bf16 drafter did not shrink, so a draft
# step now costs ~0.22 decode steps: S1 K1 D2 1.05x (0.99-1.11x, tau 1.56), S2 K1 D3 1.03x (1.02-1.05x, 1.92),
# S3 K1 D4 0.92x (2.06), the forwards timed 1.12-1.17x / 1.21-1.38x / 1.46x for 2 / 3 / 4 tokens: a step costs
# ratio(D) + 0.12 + 0.22 S (1.56 / 1.05 - 1.145 = 0.34, 1.92 / 1.03 - 1.30 = 0.56, 2.06 / 0.92 - 1.46 = 0.78), and on
# that machine the model now promises the chains 0.99-1.07x: they speculate where the timed forwards are cheap. Its
# Session 72 (the same CPU): the drafter beside a 4-bit target quantized to 4-bit groups with its forwards through the
# same kernels (engine/int4_drafter.py: ~1.1 ms a forward, from ~2.1-2.4), and both steps' products called directly
# (a decode forward ~9.1-9.9 ms, from ~11.7): taus unchanged on these questions (1.57 / 1.91 / 2.05), the forwards now
# timed 1.26-1.31x / 1.48-1.51x / 1.73-1.79x (the fixed costs the steps shed were a larger share of one token's
# forward), S1 K1 D2 1.07x (1.00-1.09x), S2 K1 D3 1.04x (0.87-1.18x), S3 K1 D4 0.98x (0.77-1.02x) of plain's 81.5
# tok/s (bench, three rounds): a step costs ratio(D) + 0.15 + 0.08 S (1.57 / 1.07 - 1.27 = 0.20, 1.91 / 1.04 - 1.49 =
# 0.35, 2.05 / 0.98 - 1.76 = 0.33; a least-squares line through them 0.16 + 0.065 S), and the model promises this
# machine's chains 0.95-1.06x. Its sampled steps decode plainly: at temperature 1 (the same machine, MT-bench 1-6, 64 tokens, two rounds in one
# process) the one-step chain ran 1.03x / 1.04x (tau 1.44) and the chain of 2 0.91x / 0.98x (1.63) of plain's 56 tok/s.
INT4_SAMPLED_NOTE = ("on the 4-bit CPU path sampled speculation measured 0.91-1.04x plain decoding at temperature 1 "
                     "on an AMD EPYC")
CPU_MAX_VERIFY_COST = 1.5
CPU_MAX_VERIFY_COST_SAMPLED = 1.2
# a greedy speculative step's cost beyond its verify forward, in one-token forwards: CPU_STEP_OVERHEAD +
# CPU_DRAFT_STEP_COST x steps (fitted to session 68's four shapes, above)
CPU_STEP_OVERHEAD = 0.05
CPU_DRAFT_STEP_COST = 0.08
CPU_MIN_GREEDY_SPEEDUP = 1.15
_CHAIN_3 = SpecConfig(steps=3, topk=1, draft_tokens=4)
_CHAIN_4 = SpecConfig(steps=4, topk=1, draft_tokens=5)
_TREE_K4 = SpecConfig(steps=4, topk=4, draft_tokens=8)
_TREE_K2 = SpecConfig(steps=5, topk=2, draft_tokens=8)
_TREE_CPU = SpecConfig(steps=3, topk=2, draft_tokens=6)
_TREE_CPU_NARROW = SpecConfig(steps=2, topk=2, draft_tokens=4)
_CHAIN_2 = SpecConfig(steps=2, topk=1, draft_tokens=3)
_CHAIN_1 = SpecConfig(steps=1, topk=1, draft_tokens=2)
# the greedy CPU shapes `cpu_choice` weighs, each with the shipped drafter's tau (mean accepted tokens a step; greedy
# float32 on the CPU, MT-bench 1-6, 64 tokens, session 68)
CPU_GREEDY_TAUS: tuple[tuple[SpecConfig, float], ...] = ((_TREE_CPU, 2.29), (_TREE_CPU_NARROW, 2.04), (_CHAIN_2, 1.91))


@dataclass(frozen=True)
class GreedyCostModel:
    """How a CPU engine's greedy steps choose a shape from its target's timed forwards (`cpu_choice`): each shape of
    `taus` (the shipped drafter's tau there) runs about tau / (ratio(D) + overhead + draft_step_cost x steps) times
    plain decoding, ratio(D) a forward of its D draft tokens in one-token forwards (`cpu_greedy_estimates`); the best
    is taken where it reaches `min_speedup`. `name` says whose model it is in the engine's message."""

    taus: tuple[tuple[SpecConfig, float], ...]
    overhead: float
    draft_step_cost: float
    min_speedup: float
    name: str


CPU_GREEDY = GreedyCostModel(CPU_GREEDY_TAUS, CPU_STEP_OVERHEAD, CPU_DRAFT_STEP_COST, CPU_MIN_GREEDY_SPEEDUP,
                             "the CPU's")
# the 4-bit CPU path's (above; the taus of the chains of 3 and 1 greedy float32 on the CPU, sessions 68 and 70, which
# session 72's quantized drafter kept on the 4-bit path; the step's costs session 72's)
INT4_GREEDY = GreedyCostModel(((_CHAIN_3, 2.06), (_CHAIN_2, 1.91), (_CHAIN_1, 1.58)), 0.15, 0.08, 1.05,
                              "the 4-bit CPU path's")
# device type -> ((largest engine, shape), ...) by increasing engine size; larger engines decode plainly by default
_DEFAULT_SPEC: dict[str, tuple[tuple[int, SpecConfig], ...]] = {
    "cpu": ((1, _TREE_CPU),),
    "cuda": ((1, _CHAIN_4), (8, _TREE_K4), (12, _CHAIN_4), (16, _CHAIN_3), (32, _TREE_K2)),
}
# the same, sampling (temperature > 0): the chain of 2 in one-row CPU engines; on CUDA the chain of 3 up to 32 rows
_DEFAULT_SPEC_SAMPLED: dict[str, tuple[tuple[int, SpecConfig], ...]] = {
    "cpu": ((1, _CHAIN_2),), "cuda": ((32, _CHAIN_3),)}
# greedy float32 on CUDA (session 38, H200, MT-bench 80, 256 tokens, continuous batching, the seventh drafter): the
# trees above were tuned in bf16, and in float32 (no tensor cores: `norm_linear_kernel.max_rows` sends steps of more
# than 8 rows to cuBLAS, where each verify row costs in full) their 64- and 256-row verifies lose: `auto`'s S4 K4 D8
# at 8 rows 0.92x, S5 K2 D8 at 32 rows 0.86x, against the chain of 3's 1.34x / 1.55x (S2 K1 D3 1.25x / 1.45x) and
# 1.77x at one row: the chain of 3 at 1-32 rows (session 39, the eighth drafter, 16 rows: 1.76x against S4 K4 D8's
# 1.16x)
_DEFAULT_SPEC_FLOAT32: dict[str, tuple[tuple[int, SpecConfig], ...]] = {"cuda": ((32, _CHAIN_3),)}
# Steps under count penalties (frequency 0.5 + repetition 1.1; session 50, H200, MT-bench 80, 128 tokens, the
# engine loaded for greedy requests): the drafter, trained on unpenalized text, is accepted less (tau 2.34 -> 1.73 at
# one row, 2.93 -> 1.98 at 32) and every verified node is adjusted (+52-55% a step against plain's +11-15%), so
# speculation lost: 1,677 against plain's 1,941 tok/s at one row (0.86x), 18,715 against 24,527 at 32 rows
# (0.76x). On this project's 2-core CPU (session 52, 2026-12-05, float32, MT-bench 1-5, 96 tokens, the same
# penalties) the chain of 3 gave 0.96x (tau 1.71), the chain of 2 0.95x (1.63), `auto`'s S2 K2 D4 0.99x (1.78):
# nothing to gain, so such steps decode plainly on both (the drafter kept in step).
_PENALIZED_PLAIN = frozenset({"cuda", "cpu"})
PENALIZED_NOTE = ("steps under count penalties decode plainly there (speculation measured 0.76-0.86x under them on "
                  "an H200 and 0.95-0.99x on a 2-core CPU: the drafter was trained on unpenalized text)")
_SLOWER: dict[str, str] = {"cuda": "not measured above 32 rows on an H200",
                           "cpu": "engines of several rows measured no faster than plain decoding on the CPU (2 rows: "
                                  "1.00x)"}


def default_drafter_path() -> Path | None:
    """The shipped drafter for the embedded SmolLM2, or None when this build carries none."""
    return DEFAULT_DRAFTER if (DEFAULT_DRAFTER / "config.json").exists() else None


def is_default_drafter(path: str | Path) -> bool:
    """Whether the folder `path` holds the shipped drafter: that folder, or a copy of its files, byte for byte."""
    shipped = default_drafter_path()
    p = Path(path)
    if shipped is None or not p.is_dir():
        return False
    if p.resolve() == shipped.resolve():
        return True
    files = [f for f in shipped.iterdir() if f.is_file()]
    # filecmp compares sizes before it reads a byte
    return all((p / f.name).is_file() and filecmp.cmp(p / f.name, f, shallow=False) for f in files)


def _entries(table: dict[str, Entries], device_type: str, max_batch_size: int) -> Entries | None:
    """A policy table's shapes for an engine of this many rows (each entry's rows capped by it); None: the table
    does not reach such an engine (plain decoding there)."""
    shapes = table.get(device_type, ())
    if not any(max_batch_size <= rows for rows, _ in shapes):
        return None
    entries = []
    for rows, spec in shapes:
        entries.append((min(rows, max_batch_size), spec))
        if max_batch_size <= rows:
            break
    return tuple(entries)


def mode_entries(device_type: str, max_batch_size: int = 1, dtype: torch.dtype | None = None
                 ) -> tuple[Entries | None, Entries | None]:
    """The measured shapes of greedy steps and of sampled steps (each None where that mode decodes plainly) for an
    engine of this many rows on this device type in this dtype (None: the device's default, bf16 on CUDA)."""
    greedy_table = _DEFAULT_SPEC_FLOAT32 if dtype == torch.float32 and device_type in _DEFAULT_SPEC_FLOAT32 \
        else _DEFAULT_SPEC
    return (_entries(greedy_table, device_type, max_batch_size),
            _entries(_DEFAULT_SPEC_SAMPLED, device_type, max_batch_size))


def penalized_entries(device_type: str) -> Entries | None:
    """The shapes of steps under count penalties on this device type: () where they decode plainly (measured
    slower there), None where they take their mode's shapes."""
    return () if device_type in _PENALIZED_PLAIN else None


def schedule_of(greedy: Entries | None, sampled: Entries | None, temperature: float = 0.0,
                penalized: Entries | None = None) -> SpecConfig | SpecSchedule | None:
    """The speculation of an engine serving at `temperature` (0: greedy) whose greedy and sampled steps pay with
    these entries (None: that mode decodes plainly): None where its own mode does not pay (the engine decodes
    plainly: `temperature` names the steps it is built for); else a schedule whose other mode's steps take their own
    shapes, decode plainly where sampled ones do not pay, or take the sampled shapes where greedy ones are not
    known (sampling's narrower shapes pay for greedy steps too: greedy accepts more a step); one shape where every
    step takes it. `penalized`: `SpecSchedule.penalized` (None: penalized steps take their mode's shapes)."""
    main = sampled if temperature > 0 else greedy
    if main is None:
        return None
    if greedy is None:
        greedy = sampled
    assert greedy is not None
    if sampled == greedy and penalized is None:
        shapes = {spec for _, spec in greedy}
        return greedy[0][1] if len(shapes) == 1 else SpecSchedule(greedy)
    # sampled steps: plain where they do not pay, as greedy steps where they take the same shapes
    own = () if sampled is None else None if sampled == greedy else sampled
    return SpecSchedule(greedy, sampled=own, penalized=penalized)


def default_spec(device_type: str, max_batch_size: int = 1, temperature: float = 0.0,
                 dtype: torch.dtype | None = None) -> SpecConfig | SpecSchedule | None:
    """What `draft="auto"` speculates with on this device type for an engine of this many rows serving at this
    temperature (0: greedy) in this dtype (None: the device's default, bf16 on CUDA); None: plain decoding is faster
    there for the engine's temperature. Greedy and sampled steps each take their mode's measured shapes, and steps
    under count penalties decode plainly where that measured faster (`mode_entries`, `penalized_entries`,
    `schedule_of`): an engine of several rows gets the shapes up to its size as a `SpecSchedule` (each step takes
    the shape of the rows it runs) where they differ, else the one shape."""
    return schedule_of(*mode_entries(device_type, max_batch_size, dtype), temperature,
                       penalized_entries(device_type))


def cpu_max_verify_cost(temperature: float = 0.0) -> float:
    """The most a forward of a shape's draft tokens may cost, in one-token forwards timed on this CPU, for
    `draft="auto"` to speculate there: greedy decoding accepts more tokens a step than sampling, so it pays up to a
    dearer verify."""
    return CPU_MAX_VERIFY_COST_SAMPLED if temperature > 0 else CPU_MAX_VERIFY_COST


def _cpu_candidates(entries: Entries, sampled: bool, one_step_first: bool = False,
                    greedy: GreedyCostModel = CPU_GREEDY) -> tuple[Entries, ...]:
    """The entries a CPU engine's steps of one mode choose from where `auto` times this machine's forwards: the greedy
    shapes of the cost model `greedy` (for the one-row tree S3 K2 D6); the sampled chain of 2, then the one-step chain
    (the one-step chain first with `one_step_first`: `hot_sampling`); any other entries alone."""
    if not sampled and entries == ((1, _TREE_CPU),):
        return tuple(((1, spec),) for spec, _ in greedy.taus)
    if sampled and entries == ((1, _CHAIN_2),):
        order = (entries, ((1, _CHAIN_1),))
        return order[::-1] if one_step_first else order
    return (entries,)


def _tokens(entries: Entries) -> int:
    """The most tokens a verify of these entries forwards in one row."""
    return spec_envelope([spec for _, spec in entries]).draft_tokens


def cpu_sizes(entries: Entries, sampled: bool, greedy: GreedyCostModel = CPU_GREEDY) -> tuple[int, ...]:
    """The forward sizes (tokens, each against one token) that `cpu_choice` needs timed on this machine for a
    mode's entries."""
    return tuple(sorted({_tokens(c) for c in _cpu_candidates(entries, sampled, greedy=greedy)}))


def cpu_greedy_estimates(ratios: Mapping[int, float], greedy: GreedyCostModel = CPU_GREEDY
                         ) -> tuple[tuple[SpecConfig, float], ...]:
    """Each shape of the cost model `greedy` with the speedup over plain decoding it gives the shape for these timed
    forwards (`ratios`: tokens -> a forward's cost in one-token forwards): tau / (ratio(D) + overhead +
    draft_step_cost x steps)."""
    return tuple((spec, tau / (ratios[spec.draft_tokens] + greedy.overhead + greedy.draft_step_cost * spec.steps))
                 for spec, tau in greedy.taus)


def cpu_choice(entries: Entries, sampled: bool, ratios: Mapping[int, float], one_step_first: bool = False,
               speculate: bool = False, greedy: GreedyCostModel = CPU_GREEDY) -> tuple[Entries | None, str | None]:
    """What a CPU engine's steps of one mode take, given this machine's timed forwards (`ratios`: tokens -> cost in
    one-token forwards, every size of `cpu_sizes`): (entries, None), or (None, why) where they decode plainly.
    Greedy steps of the shipped one-row tree take the shape of the cost model `greedy` (CPU_GREEDY; the 4-bit path's
    INT4_GREEDY) with the highest estimate (`cpu_greedy_estimates`) where it reaches its `min_speedup`; sampled ones
    the first of the chain of 2 and the one-step chain (`_cpu_candidates`' order) whose forward costs at most
    CPU_MAX_VERIFY_COST_SAMPLED; other entries theirs where it costs at most their mode's `cpu_max_verify_cost`.
    `speculate` (the drafter was asked for): never plain, the best of those shapes without the floor or the limits
    (sampled: the cheapest forward)."""
    if not sampled and entries == ((1, _TREE_CPU),):
        spec, estimate = max(cpu_greedy_estimates(ratios, greedy), key=lambda e: e[1])
        if estimate >= greedy.min_speedup or speculate:
            return ((1, spec),), None
        sizes = cpu_sizes(entries, False, greedy)
        costs = " / ".join(f"{ratios[n]:.2f}x" for n in sizes)
        return None, (f"here forwards of {' / '.join(map(str, sizes))} tokens cost {costs} one of 1 token: greedy "
                      f"speculation's best shape, S{spec.steps} K{spec.topk} D{spec.draft_tokens}, would run about "
                      f"{estimate:.2f}x plain decoding by {greedy.name} cost model, under the {greedy.min_speedup}x "
                      "it takes to speculate")
    limit = cpu_max_verify_cost(1.0 if sampled else 0.0)
    candidates = _cpu_candidates(entries, sampled, one_step_first, greedy)
    for candidate in candidates:
        if ratios[_tokens(candidate)] <= limit:
            return candidate, None
    if speculate:  # every forward over the limit: the cheapest (the first in order of a tie)
        return min(candidates, key=lambda c: ratios[_tokens(c)]), None
    tokens = _tokens(candidate)  # the last one tried
    return None, verify_cost_note(ratios[tokens], tokens, 1.0 if sampled else 0.0)


def hot_sampling(params: SamplingParams) -> bool:
    """Whether requests of these parameters sample at CPU_ONE_STEP_FIRST_TEMPERATURE or hotter with no top-p, top-k
    or min-p filter (`cpu_choice`'s one_step_first)."""
    return (params.temperature >= CPU_ONE_STEP_FIRST_TEMPERATURE and params.top_p >= 1.0 and params.top_k == 0
            and params.min_p == 0.0)


def verify_cost_note(ratio: float, tokens: int, temperature: float = 0.0) -> str:
    """Why a CPU engine decodes plainly after measuring its forwards (`api.load`), for the CLI's explanation."""
    mode = "sampled" if temperature > 0 else "greedy"
    return (f"here a forward of {tokens} tokens costs {ratio:.2f}x one of 1 token; {mode} speculation pays on the CPU "
            f"only up to {cpu_max_verify_cost(temperature)}x")


# Prefix reuse (engine/scheduler.py) by default (EngineConfig.reuse_prefixes None), session 52: on this project's
# 2-core CPU a 6-turn chat's time to first token fell from 2,015 to 170 ms at turn 6 (929-token prompt) and the
# conversation from 23.5 to 18.1 s; on an H100, an eager engine (no CUDA graphs) of SmolLM2 answering a 3,072-token
# second turn took 34.3 ms to its first token with reuse against 17.7 ms without (a whole prefill of a small model
# there is one fast causal forward; the rest after a prefix attends through a mask, launch-bound), and the first
# reused turn recompiled torch.compile's elementwise chains (0.7-4.6 s once). Larger targets (MoE) are not measured:
# pass reuse_prefixes=True to an eager engine to try it there.
_REUSES_PREFIXES = frozenset({"cpu"})


def reuses_prefixes(device_type: str) -> bool:
    """Whether engines on this device type reuse kept prefixes unless told (EngineConfig.reuse_prefixes None)."""
    return device_type in _REUSES_PREFIXES


def slower_note(device_type: str) -> str:
    """What was measured where the shipped drafter is not used by default (for the CLI's one-line explanation; greedy
    and sampled engines share the reasons since session 21's sampled policy covers the greedy one's sizes)."""
    return _SLOWER.get(device_type, f"not measured on {device_type}")
