"""The training-time test (TTT): the drafter unrolled for S steps over a whole batch, and its loss.

Notation: tokens t_0..t_{n-1} of a sample, target aux states a_j at every position j.

- Step 0 takes, at every position j, fc(a_j) (after EAGLE-3.1's input norms, if any: `project_aux`) and the token
  t_{j+1}, RoPE position j: the drafter's catch-up entry j.
- Step k >= 1 takes at position j the drafter's own step k-1 output r_{k-1,j} (pre-norm, width H, no fc; norm(r)
  with EAGLE-3.1's norm_output) and the token t_{j+1+k}, RoPE position j + k: the k-th draft past committed
  position j (spec/draft.py).
- Attention of step k at position j: the step-0 keys/values at positions <= j (causal: the committed prefix) and the
  keys/values of steps 1..k at position j only (the "diagonal": the draft chain). That is exactly what the drafter
  sees at inference when it drafts k tokens past j, so TTT logits equal inference logits (tests/test_train_ttt.py).
  A multi-layer drafter's later layers (models/eagle3.py) attend alike, each over its own keys and values.
- Implementation: keys and values of steps 0..k are concatenated along the sequence, [B, (k+1)T, H_kv, D], and one
  SDPA runs under the fixed mask [T, (k+1)T] = [tril | I | ... | I] (shared by all rows: batches are right-padded, so
  a real query never sees a padded key); step 0 is plain causal SDPA. No loop over positions, and on the GPU the
  memory-efficient kernel never materialises the [T, (k+1)T] scores. Not cuDNN's kernel (`layers.attention.
  scaled_dot_product_attention` leaves it out): its plans cost ~1.1 s for each new batch shape, forward and backward
  of 7 steps, i.e. 90-110 s for the ~80 shapes of a SmolLM2 run (about half of a 1,600-step run's training time),
  against ~0.2 s a shape without it (session 41, H200, `benchmarks/train_step_profile.py`).
- Targets: step k at position j predicts t_{j+2+k}; its soft label is the target's distribution at position j+1+k
  restricted to the draft vocabulary (features.py). It counts when t_{j+2+k} is a loss token (assistant, not past the
  end) and the target's argmax there is inside the draft vocabulary. Loss = sum_k w^k * mean over counted positions
  of the soft cross-entropy -sum_v p_v log q_v (w = 0.8); accuracy_k = P(drafter argmax == target argmax).
- Aligned positions (`align_topk` K >= 1, GRIFFIN's token-alignable training): step k >= 1 counts position j only
  if every earlier step i < k counted there and ranked the target's argmax among its top K. Step k at j is fed the
  true tokens t_{j+1..j+1+k}, a state that inference reaches only along such a path (a chain: K = 1; a tree keeping
  K candidates a step: K), so the other positions train the drafter for states it never drafts from. K = 0 (the
  default, as published): every counted position at every step.
- Sharpened labels (`sharpen` a > 1): the soft label p becomes p^a / sum(p^a) (the target's distribution over the
  draft vocabulary, its argmax unchanged, its mass moved towards it), since greedy verification accepts only the
  argmax. a = 1 (the default, as published): p itself. A sampled chain accepts by the overlap of p with the
  drafter's distribution, which a drafter trained on sharpened labels makes narrower: a greedy lever.
- Whatever K, the result also counts the chain's conditional accuracy (K = 1 aligned positions, top-1): the
  product of its first k rates estimates the share of positions a chain accepts k + 1 drafts past, so
  `acceptance_estimate(chain_correct / chain_count)` estimates a chain's acceptance length per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.attention import scaled_dot_product_attention
from ..layers.rotary import apply_rotary
from .features import TargetFeatures
from .soft_ce import soft_cross_entropy


def shift_left(x: torch.Tensor, s: int, fill: int | bool | float = 0) -> torch.Tensor:
    """[B, T, ...] -> [B, T, ...] with out[:, j] = x[:, j + s] (fill past the end)."""
    if s == 0:
        return x
    pad = torch.full_like(x[:, :s], fill)
    return torch.cat((x[:, s:], pad), dim=1)


def ttt_mask(T: int, k: int, device: torch.device | str) -> torch.Tensor:
    """[T, (k+1)T] bool: step-0 keys causally, then the diagonal of each of steps 1..k."""
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * k, dim=1)


def step_attention(qh: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """TTT step k = len(keys) - 1: qh [B, nh, T, D] (heads first), keys / values of steps 0..k, each [B, T, nkv, D]
    -> [B, nh, T, D]: causal over step 0, the diagonal of steps 1..k (module docstring)."""
    k = len(keys) - 1
    nh, nkv, T = qh.shape[1], keys[0].shape[2], qh.shape[2]
    if k == 0:  # plain causal attention: flash on CUDA, which takes grouped KV heads as they are
        return scaled_dot_product_attention(qh, keys[0].transpose(1, 2), values[0].transpose(1, 2), is_causal=True,
                                            enable_gqa=nh != nkv)
    # masked: the memory-efficient kernel on CUDA, which has no GQA, so each KV head is repeated
    kh = torch.cat(keys, dim=1).transpose(1, 2).repeat_interleave(nh // nkv, 1)  # [B, nh, (k+1)T, D]
    vh = torch.cat(values, dim=1).transpose(1, 2).repeat_interleave(nh // nkv, 1)
    return scaled_dot_product_attention(qh, kh, vh, attn_mask=ttt_mask(T, k, qh.device)[None, None])


def _ttt_attention(attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """One layer's attention at TTT step k = len(keys) (its keys / values of steps 0..k-1 given, this step's
    appended): x [B, T, in] -> o_proj's output [B, T, H]."""
    B, T = x.shape[:2]
    nh, nkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = apply_rotary(attn.q_proj(x).view(B, T, nh, D), cos, sin)
    keys.append(apply_rotary(attn.k_proj(x).view(B, T, nkv, D), cos, sin))
    values.append(attn.v_proj(x).view(B, T, nkv, D))
    o = step_attention(q.transpose(1, 2), keys, values)  # [B, nh, T, D]
    return attn.o_proj(o.transpose(1, 2).reshape(B, T, nh * D))


def ttt_hiddens(drafter: torch.nn.Module, tokens: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """tokens [B, T], aux [B, T, n_aux*Ht] -> per step k the output hidden r_k [B, T, H] (pre-norm): the last decoder
    layer's output (a drafter's later layers, models/eagle3.py, each keep their own keys and values per step)."""
    T = tokens.shape[1]
    dev = tokens.device
    mid = drafter.midlayer
    later = list(drafter.layers.values())
    pos = torch.arange(T, device=dev)[None, :]  # [1, T]
    h = drafter.project_aux(aux)  # [B, T, H]
    keys: list[list[torch.Tensor]] = [[] for _ in range(1 + len(later))]  # per layer, per step [B, T, nkv, D]
    values: list[list[torch.Tensor]] = [[] for _ in range(1 + len(later))]
    out_hiddens = []
    for k in range(steps):
        e = drafter.embed_tokens(shift_left(tokens, 1 + k))  # token t_{j+1+k} at j
        x = mid.inputs(e, h)  # [B, T, 2H]
        cos, sin = drafter.rotary(pos + k)  # [1, T, D/2]
        # h, or hidden_norm(h) with norm_before_residual
        r = mid.residual(x, h) + _ttt_attention(mid.self_attn, x, cos, sin, keys[0], values[0])
        r = r + mid.mlp(mid.post_attention_layernorm(r))
        for i, layer in enumerate(later, start=1):
            r = r + _ttt_attention(layer.self_attn, layer.input_layernorm(r), cos, sin, keys[i], values[i])
            r = r + layer.mlp(layer.post_attention_layernorm(r))
        out_hiddens.append(r)
        h = drafter.norm(r) if drafter.norm_output else r
    return out_hiddens


@dataclass
class TTTResult:
    loss: torch.Tensor  # scalar, differentiable
    step_loss: torch.Tensor  # [S] float32, mean soft CE per step (0 where nothing counted)
    correct: torch.Tensor  # [S] float32, counted positions where the drafter's argmax equals the target's
    count: torch.Tensor  # [S] float32, counted positions
    chain_correct: torch.Tensor  # [S] float32, the same over the chain's aligned positions (module docstring)
    chain_count: torch.Tensor  # [S] float32


def step_targets(feats: TargetFeatures, loss_mask: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step k's counted positions (valid [B, T] bool) and the target's argmax for them (draft ids [B, T])."""
    am = shift_left(feats.argmax, 1 + k, -1)  # [B, T] target argmax (draft id) for t_{j+2+k}
    valid = shift_left(loss_mask, 2 + k, False) & (am >= 0)
    return valid, am


def ttt_loss(drafter: torch.nn.Module, hiddens: list[torch.Tensor], feats: TargetFeatures, loss_mask: torch.Tensor,
             decay: float = 0.8, align_topk: int = 0, sharpen: float = 1.0) -> TTTResult:
    """Weighted soft cross-entropy over the unrolled steps, on counted positions only (`align_topk`: the module
    docstring's aligned positions, 0 counts every position; `sharpen`: its sharpened labels, in place in
    feats.probs, which the batch's features are not used for after).

    The counted positions of all steps are found in one `nonzero` over [S, B, T] (the step's only synchronisation
    before its end: one per step k would drain the GPU's queue S times while the host launches small kernels); each
    step's logits are still computed on its own rows, so the largest float32 tensor is [n_k, Vd], as before. Aligned
    positions are a subset of these rows, weighted 1 / 0 on the device: a dense [B, T] flag per step carries which
    positions are still on a path to the next step, again without a synchronisation."""
    if align_topk < 0 or sharpen <= 0:
        raise ValueError(f"align_topk must be >= 0 and sharpen > 0 (got {align_topk}, {sharpen})")
    if sharpen != 1.0:  # [B, T, Vd]: p^a, renormalised (rows of zeros stay zeros)
        p = feats.probs
        p.pow_(sharpen)
        p.div_(p.sum(-1, keepdim=True).clamp(min=1e-30))
    S = len(hiddens)
    dev = loss_mask.device
    B, T = loss_mask.shape
    probs = feats.probs.reshape(-1, feats.probs.shape[-1])  # [B * T, Vd], row b * T + i: position i of row b
    targets = [step_targets(feats, loss_mask, k) for k in range(S)]
    valid = torch.stack([v for v, _ in targets])  # [S, B, T]
    s_all, b_all, j_all = valid.nonzero(as_tuple=True)  # sorted by step: step k's rows are one slice
    sizes = torch.bincount(s_all, minlength=S).tolist()  # the GPU is idle right after nonzero: no wait
    count = torch.tensor(sizes, dtype=torch.float32, device=dev)
    total = torch.zeros((), device=dev)
    step_loss = torch.zeros(S, device=dev)
    correct = torch.zeros(S, device=dev)
    chain_correct = torch.zeros(S, device=dev)
    chain_count = torch.zeros(S, device=dev)
    chain_on = valid[0]  # [B, T]: positions whose chain reached step k with every draft right
    aligned_on = valid[0]  # [B, T]: the same for align_topk's top-K paths
    start = 0
    for k, r in enumerate(hiddens):
        n = sizes[k]
        b, j = b_all[start:start + n], j_all[start:start + n]
        start += n  # n == 0 still runs (empty rows): the loss keeps its graph, so backward works on any batch
        logits = drafter.lm_head(drafter.norm(r[b, j]))  # [n, Vd]
        # the label: the target's distribution for t_{j+2+k}, at position j+1+k (soft_ce.py: one fused pass on CUDA)
        ce_rows, drafted = soft_cross_entropy(logits, probs, b * T + j + 1 + k)  # [n], [n]
        want = targets[k][1][b, j]  # [n] the target's argmax (draft id)
        hit = drafted == want  # [n]
        on_chain = chain_on[b, j]  # [n] bool
        chain_correct[k] = (hit & on_chain).sum().float()
        chain_count[k] = on_chain.sum().float()
        if align_topk:
            on = aligned_on[b, j]
            w = on.float()
            ce = (ce_rows * w).sum() / w.sum().clamp(min=1)
            correct[k] = (hit & on).sum().float()
            count[k] = w.sum()
            top = hit if align_topk == 1 else (
                logits.detach().topk(min(align_topk, logits.shape[-1]), dim=-1).indices == want[:, None]).any(-1)
            aligned_on = _flags(B, T, b, j, on & top)
        else:
            ce = ce_rows.sum() / max(n, 1)
            correct[k] = hit.sum().float()
        total = total + decay**k * ce
        step_loss[k] = ce.detach()
        chain_on = _flags(B, T, b, j, on_chain & hit)
    return TTTResult(total, step_loss, correct, count, chain_correct, chain_count)


def _flags(B: int, T: int, b: torch.Tensor, j: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """[B, T] bool, True at the rows (b, j) where `on` [n] is (a step's flags, for the next step's rows)."""
    out = torch.zeros(B, T, dtype=torch.bool, device=on.device)
    out[b, j] = on
    return out


def acceptance_estimate(acc: list[float]) -> float:
    """Expected acceptance length of a chain: 1 + sum_k prod_{i<=k} acc_i."""
    tau, run = 1.0, 1.0
    for a in acc:
        run *= a
        tau += run
    return tau
