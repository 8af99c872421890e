"""The peer baseline `--peer hf`: Hugging Face transformers' own `generate` on the same model and prompts.

Contract of `run_hf(source, prompts, params, eos_ids, device, dtype, warmup)`:
- `source` is a model folder, a `.gguf` file (loaded with `AutoModelForCausalLM.from_pretrained(folder,
  gguf_file=name)`), or `("random", shape, seed)` for a random-weights model (built with `from_config` on the device,
  then given the very weights `random_model(shape, seed)` makes, so outputs are comparable);
- the model runs in `dtype` (the benchmark's: bf16 on CUDA, float32 on the CPU), batch 1, one prompt at a time, with
  the same token ids, max_new_tokens, EOS ids and greedy / temperature setting as our runs (`ignore_eos` ->
  `min_new_tokens = max_new_tokens`); `warmup` untimed generations of the first prompt come first;
- it returns a `RunRecord` (config "hf-transformers", batch size 1) whose outputs stop before EOS like ours.
transformers is imported here only, so the rest of the package does not need it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence, Union

import torch

from ..errors import ConfigError
from ..sampling_params import SamplingParams
from .runs import RunConfig, RunRecord

PEER_HF = RunConfig("hf-transformers")
Source = Union[str, Path, tuple]


def _load(source: Source, device: torch.device, dtype: torch.dtype):
    try:
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise ConfigError("--peer hf needs the transformers package (pip install transformers)") from None
    if isinstance(source, tuple):
        from .random_model import random_model, shape_config

        _, shape, seed = source
        cfg_dict = shape_config(shape)
        cfg = AutoConfig.for_model(cfg_dict.get("model_type", "llama"),
                                   **{k: v for k, v in cfg_dict.items() if k != "model_type"})
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        ours = random_model(shape, device, dtype, seed).model  # the same weights, unfused names
        missing, _ = model.load_state_dict(ours.state_dict(), strict=False)
        del ours
        if missing:
            raise ConfigError(f"transformers' {type(model).__name__} needs weights ours lack: {missing[:3]}")
    else:
        p = Path(source)
        kw: dict[str, Any] = {"dtype": dtype}
        if p.is_file():
            kw["gguf_file"] = p.name
            p = p.parent
        model = AutoModelForCausalLM.from_pretrained(str(p), **kw).to(device)
    return model.eval(), transformers.__version__


@torch.inference_mode()
def _generate(model, ids: Sequence[int], params: SamplingParams, eos_ids: Sequence[int],
              device: torch.device) -> tuple[list[int], bool]:
    x = torch.tensor([list(ids)], dtype=torch.int64, device=device)
    kw: dict[str, Any] = dict(max_new_tokens=params.max_new_tokens, attention_mask=torch.ones_like(x),
                              eos_token_id=list(eos_ids) or None, pad_token_id=(list(eos_ids) or [0])[0])
    if params.ignore_eos:
        kw["min_new_tokens"] = params.max_new_tokens
    if params.greedy:
        kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        kw.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None)
    out = model.generate(x, **kw)[0, x.shape[1] :].tolist()
    for i, t in enumerate(out):
        if t in eos_ids and not params.ignore_eos:
            return out[:i], True
    return out, False


def run_hf(source: Source, prompts: Sequence[Sequence[int]], params: SamplingParams, eos_ids: Sequence[int],
           device: torch.device, dtype: torch.dtype, warmup: int = 1, seed: int = 0) -> tuple[RunRecord, str]:
    """Our RunRecord for transformers' generate, and the transformers version."""
    model, version = _load(source, device, dtype)
    short = SamplingParams(max_new_tokens=min(params.max_new_tokens, 32), temperature=params.temperature,
                           top_p=params.top_p, top_k=params.top_k, ignore_eos=params.ignore_eos)
    for _ in range(warmup):
        _generate(model, prompts[0], short, eos_ids, device)
    torch.manual_seed(seed)
    rec = RunRecord(PEER_HF, 1)
    for p in prompts:
        t0 = time.perf_counter()
        out, stopped = _generate(model, p, params, eos_ids, device)
        rec.seconds += time.perf_counter() - t0
        rec.prompt_tokens.append(len(p))
        rec.outputs.append(out)
        rec.stopped.append(stopped)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rec, version
