"""The sampled chain's acceptance kernels on the GPU (layers/sampled_chain_kernel.py) against the PyTorch rule
(`spec.verify.verify_sampled_chain_rule`) with the same random draws: agreement and time per call.

SmolLM2's vocabulary (49,152) with a 12,288-token draft vocabulary, random distributions, chains of D = 2 and 4 nodes
at 1, 8 and 32 rows. Per case: whether accept_len, path, committed tokens and bonus are equal (the kernels and the
rule must agree exactly), the accepted-length histogram, and us per call in a CUDA graph (`probe_script.per_call_us`)
of the whole verification as the engine runs it (`verify_sampling`: the draws, then the kernels) and of the rule.

usage: python benchmarks/sampled_chain_check.py OUT_DIR [--cpu]      (PYTHONPATH=src; --cpu: the interpreter, 1 row)
"""

from __future__ import annotations

from probe_script import CPU, DEV, Emitter, per_call_us  # noqa: E402

import torch  # noqa: E402

from eaglespec.layers import sampled_chain_kernel  # noqa: E402
from eaglespec.layers.sampling import exponential_noise  # noqa: E402
from eaglespec.spec.tree import DraftTree, chain_tables  # noqa: E402
from eaglespec.spec.verify import verify_sampled_chain_rule, verify_sampling  # noqa: E402

V, VD = 49152, 12288
emit = Emitter("sampled_chain.json")
g = torch.Generator(device=DEV).manual_seed(0)
for B in (1,) if CPU else (1, 8, 32):
    for D in (2, 4):
        probs = torch.softmax(torch.randn(B, D, V, device=DEV, generator=g) * 3, -1)
        ids = torch.randperm(V, device=DEV, generator=g)[:VD].sort().values
        index = torch.full((V,), -1, dtype=torch.int64, device=DEV).index_copy_(
            0, ids, torch.arange(VD, device=DEV))
        # drafts close to the target (so that some are accepted): r = q restricted to the draft vocabulary, sharpened
        dprobs = torch.softmax(torch.log(probs[:, :-1, ids] + 1e-9) * 1.3, -1).contiguous()
        tokens = torch.zeros(B, D, dtype=torch.int64, device=DEV)
        tokens[:, 1:] = ids[torch.multinomial(dprobs.view(-1, VD), 1, generator=g).view(B, D - 1)]
        parents, depth, anc, children, paths = chain_tables(D, D - 1, probs.device)
        tree = DraftTree(tokens=tokens, parents=parents.expand(B, D), depth=depth.expand(B, D),
                         ancestors=anc.expand(B, D, D), children=children.expand(B, D, 1), paths=paths.expand(B, D, D))
        same, hist = True, torch.zeros(D, dtype=torch.int64)
        for _ in range(3 if CPU else 20):
            u = torch.rand(B, D - 1, device=DEV, generator=g)
            e = exponential_noise((B, V), torch.float32, probs.device, g)
            ref = verify_sampled_chain_rule(tree, probs, dprobs, index, u, e)
            got = sampled_chain_kernel.accept_sampled_chain(probs, dprobs, index, tokens, u, e, D)
            same &= all(torch.equal(a, b) for a, b in zip(got, (ref.accept_len, ref.path, ref.tokens, ref.bonus)))
            hist += torch.bincount(got[0].cpu(), minlength=D)
        u0 = torch.rand(B, D - 1, device=DEV, generator=g)
        e0 = exponential_noise((B, V), torch.float32, probs.device, g)
        emit({"rows": B, "D": D, "equal": same, "accepted_hist": hist.tolist(),
             "us_engine_path": per_call_us(lambda: verify_sampling(tree, probs, None, dprobs, index)),
             "us_kernels_only": per_call_us(
                 lambda: sampled_chain_kernel.accept_sampled_chain(probs, dprobs, index, tokens, u0, e0, D)),
             "us_pytorch_rule": per_call_us(lambda: verify_sampled_chain_rule(tree, probs, dprobs, index, u0, e0))})
