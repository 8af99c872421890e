"""`eaglespec check MODEL`: does a model implement the EAGLE-3 target protocol? (exit 0 yes, 1 no)

MODEL is a checkpoint (folder or .gguf: its registered class is built on the meta device, no weights are read) or a
Python class given as `package.module:Class` or `package.module.Class`.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import torch

from ..errors import ConfigError
from ..protocol import check_target


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="check that a model implements the EAGLE-3 target protocol")
    p.add_argument("model", help="model folder, .gguf file, or dotted path to a Python class")


def resolve_class(spec: str) -> type:
    module, sep, name = spec.partition(":")
    if not sep:
        module, _, name = spec.rpartition(".")
    if not module or not name:
        raise ConfigError(f"{spec!r} is neither an existing path nor a dotted path to a class (package.module:Class)")
    try:
        obj = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        raise ConfigError(f"cannot import {module!r} ({e.msg})") from None
    except AttributeError:
        raise ConfigError(f"module {module!r} has no attribute {name!r}") from None
    if not isinstance(obj, type):
        raise ConfigError(f"{spec} is not a class")
    return obj


def run(args: argparse.Namespace) -> int:
    if Path(args.model).exists():
        from ..loading.checkpoint import load_config
        from ..models import get_model_class

        config = load_config(args.model)
        cls = get_model_class(config.architecture)
        with torch.device("meta"):
            target = cls(config)
    else:
        target = resolve_class(args.model)
    report = check_target(target)
    print(report.message())
    return 0 if report.ok else 1
