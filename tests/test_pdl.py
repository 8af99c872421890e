"""layers/pdl.py: when our Triton kernels are launched with programmatic dependent launch (policy only; the kernels'
own tests run them with PDL off in the interpreter, and benchmarks/pdl_check.py compares both on the GPU)."""

from __future__ import annotations

import pytest
import torch

from eaglespec.layers import pdl


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(pdl, "ENABLED", None)
    monkeypatch.delenv("EAGLESPEC_PDL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pdl._env_enabled.cache_clear()
    monkeypatch.setattr(pdl, "_supports", lambda index: index == 0)  # device 0 is a Hopper, device 1 older
    yield
    pdl._env_enabled.cache_clear()


def test_cpu_tensors_never_take_pdl(fresh):
    assert pdl.launch_options(torch.zeros(2)) == {"PDL": False}
    assert not pdl.enabled(torch.device("cpu"))


def test_on_by_default_on_hopper_only(fresh):
    assert pdl.enabled(torch.device("cuda", 0))
    assert not pdl.enabled(torch.device("cuda", 1))  # compute capability < 9: plain launches


def test_environment_and_override_turn_it_off(fresh, monkeypatch):
    monkeypatch.setenv("EAGLESPEC_PDL", "0")
    pdl._env_enabled.cache_clear()
    assert not pdl.enabled(torch.device("cuda", 0))
    monkeypatch.setattr(pdl, "ENABLED", True)  # the benchmarks' switch wins over the environment
    assert pdl.enabled(torch.device("cuda", 0))
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert not pdl.enabled(torch.device("cuda", 0))


def test_the_interpreter_keeps_it_off(fresh, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the CPU tests' Triton: griddepcontrol is GPU assembly
    pdl._env_enabled.cache_clear()
    assert not pdl.enabled(torch.device("cuda", 0))


def test_every_kernel_launched_with_pdl_waits():
    """The contract of layers/pdl.py, checked on the sources: in every module that launches with `launch_options`,
    each Triton kernel takes the PDL constexpr and calls gdc_wait() under it (a kernel launched early that never
    waited would race with the kernel before it), and the launch options pair the constexpr with the attribute."""
    import ast
    import pathlib

    import eaglespec.layers as layers

    assert pdl._ON == {"PDL": True, "launch_pdl": True} and pdl._OFF == {"PDL": False}
    checked = helpers = 0
    for path in sorted(pathlib.Path(layers.__file__).parent.glob("*.py")):
        src = path.read_text()
        if "launch_options(" not in src or path.name == "pdl.py":
            continue
        jitted = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)
                  and any("jit" in ast.unparse(d) for d in n.decorator_list)]
        # the names jit functions call: a device helper is called by a kernel (after that kernel's wait), under its
        # own name or as the module global `_name` (short_attention_kernel binds them so), and is never launched
        called = {c.func.id for f in jitted for c in ast.walk(f) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Name)}
        for node in jitted:
            if node.name in called or f"_{node.name}" in called:
                helpers += 1
                continue
            args = [a.arg for a in node.args.args]
            assert "PDL" in args, f"{path.name}: {node.name} has no PDL parameter"
            waits = [n for n in ast.walk(node) if isinstance(n, ast.If) and ast.unparse(n.test) == "PDL"
                     and "gdc_wait()" in ast.unparse(n)]
            assert waits, f"{path.name}: {node.name} never waits under PDL"
            checked += 1
    assert checked >= 32  # norm + projection (2), norm + SiLU, GEMV, attention (3), RoPE store, argmax (2), top-k
    #                      (3), tree (3), tree construction (2), the drafter's input, the commit (2), the KV
    #                      compaction, the sampling kernels (4), the sampled chain's acceptance (2), the MoE router,
    #                      the grouped experts' layout, GEMM and pair sum
    assert helpers >= 10  # the attention kernels' block_scores, pv_product, query_tile, online_block, merge_split
    #                       and store_output; the sampling kernels' race, row_params, tile and quarters
