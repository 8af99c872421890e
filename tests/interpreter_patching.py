"""Triton's interpreter, faster where it repeats work (test support only): its patching of `triton.language` once per
kernel run, and xor reductions (`tl.sort`'s) in numpy.

Under TRITON_INTERPRET=1, Triton 3.6's interpreter patches `triton.language` (its builtins, `tl.tensor`'s operators,
`tl.range`, the reductions) before each kernel runs and restores it after (`GridExecutor.__call__`), and patches it
again, without restoring, at every call of a nested `@triton.jit` function (`InterpretedFunction.__call__`): each
such call walks the modules with `inspect.getmembers`. The kernels' helpers (and `tl.sort`'s bitonic steps) are
nested calls, so the repeated patching was ~22% of a MoE engine test's time (the router, sort and grouped GEMM
kernels: `test_moe_kernel.py`'s static-path tests, 28-58 s each in the suite).

`skip_repeated_patching()` wraps the interpreter's `_patch_lang` so that, while a kernel runs, a nested function
whose language modules (the `triton.language` / `triton.language.core` modules its globals name) were already
patched in this kernel's run is not patched again; the first nested function of a module set not yet patched in
this run is (`triton/language/standard.py` names `core`, the kernels `tl`). Nothing else changes: the patches a
nested call would make are the ones in force already, and the kernel's own patches are restored after it as before.
`tl.sort` (the MoE block layout's kernel, the tree builder's) runs bitonic steps whose `xor_sum` reduces with a
combine function the interpreter does not know, so it reduces element by element in Python, calling the combine
function on scalar tensors (~6.6 s of one MoE engine test and the router and tree-build kernel tests);
`numpy_xor_reductions()` gives it numpy's `bitwise_xor.reduce`, as the interpreter already does for sums, minima and
maxima (xor is exact, associative and commutative: the same bits in any order).
A Triton without these internals (another version) is left as it is: the tests then run at the old speed.
"""

from __future__ import annotations

from typing import Any, Callable


def _lang_key(fn: Callable[..., Any], langs: tuple[object, ...]) -> frozenset[int]:
    """The ids of the language modules `fn`'s globals name (as the interpreter's `_patch_lang` finds them)."""
    return frozenset(id(v) for v in fn.__globals__.values() if any(v is lang for lang in langs))


def skip_repeated_patching() -> bool:
    """Install the wrapper (once); False where this Triton's interpreter lacks the internals it wraps."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    patch, grid, nested = (getattr(ti, n, None) for n in ("_patch_lang", "GridExecutor", "InterpretedFunction"))
    if patch is None or grid is None or nested is None:
        return False
    if getattr(patch, "_skips_repeats", False):
        return True
    langs = (tl, tl.core)
    keys: dict[Callable[..., Any], frozenset[int]] = {}
    state: dict[str, Any] = {"running": 0, "outer": False, "patched": frozenset()}
    grid_call = grid.__call__

    def run_kernel(self, *args, **kwargs):  # GridExecutor.__call__: one kernel over its grid
        saved = dict(state)
        state.update(running=state["running"] + 1, outer=True, patched=frozenset())
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            state.update(saved)

    def patch_lang(fn):
        key = keys.get(fn)
        if key is None:
            key = keys[fn] = _lang_key(fn, langs)
        if state["outer"]:  # the kernel's own patching (GridExecutor restores it)
            state["outer"] = False
        elif state["running"] and key <= state["patched"]:
            return None  # a nested function's (InterpretedFunction.__call__ ignores the result): already in force
        scope = patch(fn)
        state["patched"] = state["patched"] | key
        return scope

    patch_lang._skips_repeats = True
    ti._patch_lang = patch_lang
    grid.__call__ = run_kernel
    return True


def numpy_xor_reductions() -> bool:
    """Route the interpreter's xor reductions to numpy (once); False where this Triton lacks the internals."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    reduce_ops, xor = getattr(ti, "ReduceOps", None), getattr(tl.standard, "_xor_combine", None)
    apply_impl = getattr(reduce_ops, "apply_impl", None)
    if apply_impl is None or xor is None or not hasattr(reduce_ops, "to_tensor"):
        return False
    if getattr(apply_impl, "_xor_in_numpy", False):
        return True

    def reduce(self, input):  # ReduceOps.apply_impl; input: a tuple of tensors (one for xor_sum)
        if self.combine_fn == xor and len(input) == 1:
            data = input[0].handle.data
            return self.to_tensor(np.bitwise_xor.reduce(data, axis=self.axis, keepdims=self.keep_dims), input[0].dtype)
        return apply_impl(self, input)

    reduce._xor_in_numpy = True
    reduce_ops.apply_impl = reduce
    return True
