"""The embedded SmolLM2 rewritten as llama.cpp's Q4_K_M would write it, on the 4-bit CPU path.

SmolLM2-135M's rows of 576 are no multiple of the K-quants' 256, so llama.cpp's Q4_K_M falls back for them
(`llama_tensor_get_type`: Q4_K -> Q5_0, Q6_K -> Q8_0): q / k / o / gate / up (576 wide) Q5_0, v Q5_0 or (its
"more bits" layers) Q8_0, down (1,536 wide) Q4_K or Q6_K, the tied embedding Q8_0. This script rewrites the shipped
Q4_1 file so (its float32 weights requantized: gguf for Q5_0 / Q8_0, tests/gguf_write.quantize_k for Q4_K / Q6_K;
metadata and tokenizer copied), then, one row, greedy, 64 new tokens of MT-bench 1-6: plain decoding 4-bit against
dense float32 on both files, and the default drafter's speculation on the rewritten one (its tokens against its own
plain decoding's).

With GGUF paths after OUT_DIR (SmolLM2 files written by llama.cpp's own llama-quantize, say), those files are run
instead of the rewritten one, the same way (the shipped Q4_1 file first as the reference).

usage: PYTHONPATH=src python benchmarks/smollm2_kquant.py OUT_DIR [GGUF ...]      (~3 minutes a file on 2 cores)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gguf_write import quantize_k  # noqa: E402

from eaglespec import api  # noqa: E402
from eaglespec.assets import default_drafter_path  # noqa: E402
from eaglespec.bench.datasets import mt_bench  # noqa: E402
from eaglespec.config import EngineConfig  # noqa: E402
from eaglespec.loading.default import default_model_path  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

Q = gguf.GGMLQuantizationType


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m_type(name: str, layers: int) -> Q | None:
    """The type llama.cpp's Q4_K_M gives SmolLM2's tensor `name` (after its fallbacks), None: kept as it is."""
    if not name.endswith(".weight") or "norm" in name:
        return None
    if name == "token_embd.weight":
        return Q.Q8_0  # the tied head's Q6_K, falling back
    layer = int(name.split(".")[1])
    if ".attn_v." in name:
        return Q.Q8_0 if more_bits(layer, layers) else Q.Q5_0
    if ".ffn_down." in name:
        return Q.Q6_K if more_bits(layer, layers) else Q.Q4_K
    return Q.Q5_0


def rewrite(src: Path, dst: Path) -> dict[str, int]:
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    layers = r.fields[f"{arch}.block_count"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = f.types[1] if len(f.types) > 1 else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    counts: dict[str, int] = {}
    for t in r.tensors:
        qtype = q4_k_m_type(t.name, layers)
        if qtype is None:
            w.add_tensor(t.name, np.array(t.data), raw_shape=None, raw_dtype=t.tensor_type)
            continue
        shape = tuple(int(d) for d in reversed(t.shape))
        x = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        data = quantize_k(x, qtype) if qtype in (Q.Q4_K, Q.Q6_K) else gguf.quants.quantize(x, qtype)
        w.add_tensor(t.name, data, raw_dtype=qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts


def types_of(path: Path) -> dict[str, int]:
    """How many of a GGUF's matrices each type holds."""
    found: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if len(t.shape) > 1:
            found[t.tensor_type.name] = found.get(t.tensor_type.name, 0) + 1
    return found


def run(path: Path, weights: str, draft: str | None, prompts: list[str]) -> tuple[float, list[list[int]], object]:
    cfg = EngineConfig(device="cpu", max_batch_size=1, cpu_weights=weights)
    engine = api.load(str(path), draft=draft, config=cfg)
    params = SamplingParams(max_new_tokens=64)
    engine.generate(prompts[:1], params)  # warm-up
    t = time.perf_counter()
    outs = [engine.generate([p], params)[0].token_ids for p in prompts]
    rate = sum(len(o) for o in outs) / (time.perf_counter() - t)
    return rate, outs, engine


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    src = default_model_path()
    if len(sys.argv) > 2:
        files = [Path(a) for a in sys.argv[2:]]
        counts = {f.name: types_of(f) for f in files}
    else:
        dst = out / "SmolLM2-135M-Instruct.Q4_K_M-like.gguf"
        counts = rewrite(src, dst)
        print("rewritten:", counts, f"{dst.stat().st_size / 1e6:.1f} MB (the Q4_1 file {src.stat().st_size / 1e6:.1f})")
        files = [dst]
    print(json.dumps(counts), flush=True)
    prompts = [item.first for item in mt_bench()[:6]]
    rows = []
    for path in [src] + files:
        name = "Q4_1 (shipped)" if path == src else path.name
        for weights in ("q4", "dense"):
            rate, outs, engine = run(path, weights, None, prompts)
            rows.append(dict(file=name, weights=weights, tok_s=round(rate, 1)))
            print(json.dumps(rows[-1]), flush=True)
            if path != src and weights == "q4":
                plain = outs
                print("answer 1:", engine.tokenizer.decode(outs[0])[:160].replace("\n", " "))
            del engine
        if path == src:
            continue
        rate, spec, engine = run(path, "q4", str(default_drafter_path()), prompts)
        rows.append(dict(file=name, weights="q4 + drafter (auto)", tok_s=round(rate, 1),
                         identical=f"{sum(a == b for a, b in zip(spec, plain))}/{len(plain)}",
                         speculative=bool(engine.speculative)))
        print(json.dumps(rows[-1]), flush=True)
        del engine
    (out / "smollm2_kquant.json").write_text(json.dumps(dict(types=counts, rows=rows), indent=1))


if __name__ == "__main__":
    main()
