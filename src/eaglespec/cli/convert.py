"""`eaglespec convert MODEL.gguf OUT_DIR`: write a standard HF folder that `--model OUT_DIR` loads."""

from __future__ import annotations

import argparse
import sys

import torch


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a GGUF file into an HF folder (config, safetensors, tokenizer)")
    p.add_argument("gguf")
    p.add_argument("out_dir")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])


def run(args: argparse.Namespace) -> int:
    from ..loading.convert import convert_gguf

    convert_gguf(args.gguf, args.out_dir, dtype=getattr(torch, args.dtype))
    print(f"[eaglespec] wrote {args.out_dir}", file=sys.stderr)
    return 0
