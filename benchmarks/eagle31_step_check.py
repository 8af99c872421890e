"""What does an EAGLE-3.1 drafter cost per speculative step against a plain EAGLE-3 one? Its aux norm (an RMSNorm over
the concatenated aux states before fc) runs at every catch-up, and with norm_output the final norm's output is
what the next step takes, so the fused final norm + draft head kernel is left aside for the norm and the head run
apart. Random SmolLM2-135M weights and random drafters of both forms (bf16, CUDA graphs; probe_script), alternating
A B B A: ms per replay of the draft graph and of the whole step (draft, verify, commit), chains of 3 at 1 and 8
rows. CUDA only (the graphs).

usage: python benchmarks/eagle31_step_check.py OUT_DIR
"""

from __future__ import annotations

from probe_script import CPU, DEV, DT, DRAFT_CASES, Emitter, draft_step_ms, random_pair  # noqa: E402

from eaglespec.bench.random_model import build_on_meta, drafter_config, materialize_random  # noqa: E402
from eaglespec.config import ModelConfig  # noqa: E402
from eaglespec.engine.transforms import prepare_for_inference  # noqa: E402
from eaglespec.models.eagle3 import LlamaForCausalLMEagle3  # noqa: E402

emit = Emitter("eagle31_step_check.json")
m, plain = random_pair(draft_vocab=12288 if not CPU else None)
cfg = drafter_config(m.config, plain.draft_vocab_size)
cfg31 = ModelConfig.from_hf({**cfg.raw, "norm_before_fc": True, "norm_output": True})
d31 = materialize_random(build_on_meta(LlamaForCausalLMEagle3, cfg31, DT), DEV, 1)
d31.d2t.copy_(plain.d2t)
d31.t2d.copy_(plain.t2d)
prepare_for_inference(d31, DEV, None, None)
cases = DRAFT_CASES[:2]  # chains of 3 at 1 and 8 rows
for name, d in (("eagle3", plain), ("eagle3.1", d31), ("eagle3.1", d31), ("eagle3", plain)):
    emit({"drafter": name, **draft_step_ms(m, d, cases)})
