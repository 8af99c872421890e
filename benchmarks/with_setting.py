"""Run a benchmark script with module-level settings overridden, for A/B measurements of a policy constant in one
device call without editing the tree.

usage: python benchmarks/with_setting.py MODULE.ATTR=VALUE [MODULE.ATTR=VALUE ...] -- SCRIPT.py [ARGS...]
       python benchmarks/with_setting.py MODULE.ATTR=VALUE ... -- -m eaglespec bench [ARGS...]   (a module: the CLI)
VALUE is a Python literal (int, float, bool, None). The modules are imported (from the eaglespec package: e.g.
`eaglespec.layers.short_attention_kernel.BLOCK_KV=64`) and set before SCRIPT runs as __main__.
"""

from __future__ import annotations

import ast
import importlib
import runpy
import sys

split = sys.argv.index("--")
for item in sys.argv[1:split]:
    name, value = item.split("=", 1)
    module, attr = name.rsplit(".", 1)
    setattr(importlib.import_module(module), attr, ast.literal_eval(value))
    print(f"with {name} = {value}", file=sys.stderr, flush=True)
if sys.argv[split + 1] == "-m":  # a module as `python -m` runs it
    module = sys.argv[split + 2]
    sys.argv = [module] + sys.argv[split + 3:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    script = sys.argv[split + 1]
    sys.argv = sys.argv[split + 1:]
    sys.path.insert(0, str(__import__("pathlib").Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")
