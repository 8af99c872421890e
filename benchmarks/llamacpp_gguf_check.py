"""GGUFs written by llama.cpp's own llama-quantize through the 4-bit CPU path: which tensors it takes, how faithfully,
and whether greedy text agrees with llama.cpp's.

Builds nothing itself: give it llama.cpp's bin folder (`llama-quantize`, `llama-simple`). One way, from PyPI's source
package of llama-cpp-python (which vendors llama.cpp; 0.3.36 holds llama.cpp commit 0c1e570):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp && cd /tmp/lcp &&
    tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp &&
    cmake -B build -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF &&
    cmake --build build --target llama-quantize llama-simple -j2          (~6 minutes on 2 cores)

Sources, written to OUT_DIR: the embedded SmolLM2 as an F32 GGUF (its Q4_1 values, metadata and tokenizer: 576-wide
rows, so llama.cpp's K-quant mixes fall back to Q5_0 / Q5_1 / Q8_0 for most tensors, and a Q5 mix of 4-bit values is
a requantization), and a Llama shape of Gaussian weights whose rows are multiples of 256 (hidden 1,024, 4 layers, no
tokenizer: the K-quants proper). Each is quantized to each type of TYPES, then, per file: the types of its matrices,
`Int4Linear.from_weight` on every projection (products a layer, runs, refusals, the worst error of a 4-row product
against the float32 weights' relative to its largest output: bf16 activations and scales, so ~1e-2), and for the
SmolLM2 files 40 greedy tokens of five raw prompts from llama-simple against eaglespec's dense float32 and 4-bit
engines (characters in common from the start: llama.cpp rounds its activations to 8 bits for quantized products, so
near-ties part the texts after a while).

usage: PYTHONPATH=src python benchmarks/llamacpp_gguf_check.py LLAMA_CPP_BIN OUT_DIR     (~10 minutes on 2 cores)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_loading_gguf import write_tiny_gguf  # noqa: E402

from eaglespec import api  # noqa: E402
from eaglespec.config import EngineConfig  # noqa: E402
from eaglespec.layers.int4_linear import Int4Linear  # noqa: E402
from eaglespec.loading.checkpoint import load_model  # noqa: E402
from eaglespec.loading.default import default_model_path  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

Q = gguf.GGMLQuantizationType
TYPES = ["Q4_0", "Q8_0", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS", "IQ3_M"]
PROMPTS = ["Once upon a time, in a small village,", "def fibonacci(n):", "The three primary colors are",
           "Write a short poem about the sea.\n", "In 1969, the first humans"]
KINDS = ["token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]


def smollm2_f32(dst: Path) -> None:
    """The embedded SmolLM2's tensors dequantized to F32, its metadata (file type: all F32) and tokenizer copied."""
    r = gguf.GGUFReader(str(default_model_path()))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = 0 if key == "general.file_type" else f.contents()
        w.add_key_value(key, value, f.types[0], sub_type=f.types[1] if len(f.types) > 1 else None)
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def layers_taken(path: Path) -> dict:
    """Int4Linear.from_weight on every projection of the file (unfused, as the checkpoint names them)."""
    model = load_model(path, dtype=torch.float32).model
    products: Counter = Counter()
    refused, worst, most_runs = [], 0.0, 1
    t = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    for name, m in model.named_modules():
        if type(m) is not torch.nn.Linear:
            continue
        q = Int4Linear.from_weight(m.weight.detach())
        if q is None:
            refused.append(name)
            continue
        products[str(len(q.terms)) if q.runs is None else "runs"] += 1
        most_runs = max(most_runs, len(q.runs or [0]))
        x = torch.randn(4, m.in_features, generator=g).to(torch.bfloat16)
        ref = x.float() @ m.weight.detach().t()
        worst = max(worst, float((q(x).float() - ref).abs().max() / ref.abs().max()))
    return dict(products=dict(products), most_runs=most_runs, refused=len(refused), first_refused=refused[:2],
                worst_error=f"{worst:.1e}", seconds=round(time.perf_counter() - t, 1))


def common(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def text_agreement(path: Path, simple: Path, four_bit: bool) -> list[dict]:
    """Greedy continuations of PROMPTS: llama-simple's against eaglespec's dense and (where it takes every projection)
    4-bit engines."""
    engines = {w: api.load(str(path), draft=None, config=EngineConfig(device="cpu", max_batch_size=1, cpu_weights=w))
               for w in (("dense", "q4") if four_bit else ("dense",))}
    rows = []
    for p in PROMPTS:
        ref = subprocess.run([str(simple), "-m", str(path), "-n", "40", p], capture_output=True, text=True).stdout
        ref = ref[len(p):] if ref.startswith(p) else ref
        ids = engines["dense"].tokenizer.encode(p)
        ours = {w: e.tokenizer.decode(e.generate([ids], SamplingParams(max_new_tokens=40))[0].token_ids)
                for w, e in engines.items()}
        q4 = f"{common(ours['dense'], ours['q4'])}/{len(ours['dense'])}" if four_bit else "-"
        rows.append(dict(prompt=p[:24], llama_cpp_vs_dense=f"{common(ref, ours['dense'])}/{len(ref)}", dense_vs_q4=q4))
    return rows


def main() -> None:
    bin_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    sources = {"smollm2": out / "smollm2-f32.gguf", "llama1024": out / "llama1024-f32.gguf"}
    if not sources["smollm2"].exists():
        smollm2_f32(sources["smollm2"])
    if not sources["llama1024"].exists():
        write_tiny_gguf(sources["llama1024"], {k: Q.F32 for k in KINDS}, hidden=1024, heads=16, kv_heads=4, ffn=2816,
                        layers=4, vocab=32000)
    rows = []
    for src_name, src in sources.items():
        for qtype in TYPES:
            dst = out / f"{src_name}-{qtype}.gguf"
            if not dst.exists():
                subprocess.run([str(bin_dir / "llama-quantize"), str(src), str(dst), qtype, "2"], check=True,
                               capture_output=True)
            types = Counter(t.tensor_type.name for t in gguf.GGUFReader(str(dst)).tensors if len(t.shape) > 1)
            row = dict(file=dst.name, types=dict(types), **layers_taken(dst))
            if src_name == "smollm2":
                row["text"] = text_agreement(dst, bin_dir / "llama-simple", row["refused"] == 0)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "llamacpp_gguf_check.json").write_text(json.dumps(rows, indent=1))
    print("| file | matrices by type | projections by products | refused | worst error |")
    print("| --- | --- | --- | ---: | ---: |")
    for r in rows:
        types = ", ".join(f"{k} {v}" for k, v in r["types"].items())
        prods = ", ".join(f"{k}: {v}" for k, v in sorted(r["products"].items()))
        print(f"| {r['file']} | {types} | {prods} | {r['refused']} | {r['worst_error']} |")


if __name__ == "__main__":
    main()
