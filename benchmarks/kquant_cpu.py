"""K-quant GGUFs on the CPU: the 4-bit path (layers/kquant_groups.py) against dense float32, one row, plain decoding.

Writes GGUFs of one Llama shape (hidden 1024, 16 layers of 16 heads / 4 KV heads, feed-forward 2,816, vocabulary
32,000, untied head: ~211M parameters; Gaussian weights, no tokenizer) in llama.cpp's mixes (tests/gguf_write.py's
plain K-quant quantizer): Q4_K_M (Q4_K, Q6_K for v, down and the head), Q5_K_M (Q5_K, Q6_K there) and Q6_K, and a
Q4_0 file (the types taken before) for reference. For each: the load (float32) and the conversion's seconds, then
best-of-ROUNDS one-row plain decoding of 64 tokens after a 32-token prompt, 4-bit against `--cpu-weights dense`
(float32), alternating, with the tokens each produced.

usage: PYTHONPATH=src python benchmarks/kquant_cpu.py OUT_DIR [ROUNDS]      (~5 minutes on 2 cores)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gguf import GGMLQuantizationType as Q  # noqa: E402
from test_loading_gguf import write_tiny_gguf  # noqa: E402

from eaglespec.config import EngineConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.engine.transforms import prepare_for_inference  # noqa: E402
from eaglespec.loading.checkpoint import load_model  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

SHAPE = dict(hidden=1024, heads=16, kv_heads=4, ffn=2816, layers=16, vocab=32000)
K_M = {"token_embd": Q.Q4_K, "output": Q.Q6_K, "attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K,
       "attn_output": Q.Q4_K, "ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K}
MIXES = {
    "Q4_K_M": K_M,
    "Q5_K_M": {k: (Q.Q5_K if v == Q.Q4_K else v) for k, v in K_M.items()},
    "Q6_K": {k: Q.Q6_K for k in K_M},
    "Q4_0": {k: Q.Q4_0 for k in K_M},
}
CPU = torch.device("cpu")


def decode(engine: Engine, prompt: list[int]) -> tuple[float, list[int]]:
    t = time.perf_counter()
    out = engine.generate([prompt], SamplingParams(max_new_tokens=64, ignore_eos=True))[0]
    return len(out.token_ids) / (time.perf_counter() - t), out.token_ids


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    prompt = [(7 * i + 3) % SHAPE["vocab"] for i in range(32)]
    rows = []
    for mix, types in MIXES.items():
        path = out / f"{mix}.gguf"
        if not path.exists():
            write_tiny_gguf(path, types=types, **SHAPE)
        t = time.perf_counter()
        model = load_model(path, dtype=torch.float32).model
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        int4 = prepare_for_inference(model, CPU, None, None, int4=True)
        convert_s = time.perf_counter() - t
        dense = prepare_for_inference(load_model(path, dtype=torch.float32).model, CPU, None, None, int4=False)
        engines = {"4-bit": Engine(int4, None, EngineConfig(max_batch_size=1)),
                   "dense": Engine(dense, None, EngineConfig(max_batch_size=1))}
        best = {k: 0.0 for k in engines}
        tokens = {}
        for e in engines.values():
            decode(e, prompt)  # warm-up
        for _ in range(rounds):
            for name, e in engines.items():
                rate, tokens[name] = decode(e, prompt)
                best[name] = max(best[name], rate)
        terms = {}
        for m in int4.modules():
            n = len(getattr(m, "terms", ()))
            if n:
                terms[n] = terms.get(n, 0) + 1
        row = dict(mix=mix, load_s=round(load_s, 2), convert_s=round(convert_s, 2), int4_tok_s=round(best["4-bit"], 1),
                   dense_tok_s=round(best["dense"], 1), speedup=round(best["4-bit"] / best["dense"], 2),
                   same_tokens=tokens["4-bit"] == tokens["dense"], layers_by_products=terms)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del engines, int4, dense, model
    (out / "kquant_cpu.json").write_text(json.dumps(rows, indent=1))
    print("| mix | load s | 4-bit conversion s | 4-bit tok/s | dense float32 tok/s | 4-bit / dense |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['mix']} | {r['load_s']} | {r['convert_s']} | {r['int4_tok_s']} | {r['dense_tok_s']} | "
              f"{r['speedup']}x |")


if __name__ == "__main__":
    main()
