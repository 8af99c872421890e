"""The EAGLE-3 target protocol, delegation for wrappers, and the conformance check.

The protocol (REFERENCE.md §2; SGLang's names) is what the speculative engine needs from a target:

- `get_embed_and_head()` -> (embed_tokens.weight, lm_head.weight), the live tensors;
- `set_embed_and_head(embed, head)` replaces both;
- `set_eagle3_layers_to_capture(layer_ids)`: forward then also returns the aux states (outputs of those 0-based
  layers, concatenated on the last dim).

Convention: layer id i means the output of layer i (SGLang; equal to the official EAGLE repo's "input of layer i+1").
The default ids are `[1, N//2 - 1, N - 4]`. vLLM reads id k as "after k layers"; `EngineConfig.aux_convention="vllm"`
converts such ids (k -> k - 1) before they reach the target, so the protocol itself has one convention.

Wrappers (a vision tower + projector + `language_model`) declare, inside their class body::

    class MyVLM(nn.Module):
        eagle3 = delegate_eagle3("language_model")

which defines every protocol method (and the engine's `kv_cache_shapes` / `embed`) on the class as a forwarder to
`self.language_model`; the aux states come back unchanged because the wrapper's forward returns the inner output.

`check_target(model_or_class)` reports what is missing, names the attribute to delegate to, and spots the appended
patch (protocol functions defined at module level after the class, outside it).
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import ProtocolError

PROTOCOL_METHODS: tuple[str, ...] = ("get_embed_and_head", "set_embed_and_head", "set_eagle3_layers_to_capture")
# Engine-side methods a wrapper forwards too (not part of the EAGLE-3 protocol proper).
ENGINE_METHODS: tuple[str, ...] = ("kv_cache_shapes", "embed")
CONVENTIONAL_INNER = ("language_model", "model", "text_model", "llm", "lm")


def _forwarder(name: str, attr: str, owner: type) -> Callable[..., Any]:
    def method(self, *args, **kwargs):
        return getattr(getattr(self, attr), name)(*args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"{owner.__qualname__}.{name}"
    method.__module__ = owner.__module__
    method.__doc__ = f"EAGLE-3 protocol: delegated to `self.{attr}.{name}`."
    method.__eagle3_delegate__ = attr  # type: ignore[attr-defined]
    return method


class delegate_eagle3:  # noqa: N801 (used like a declaration in a class body)
    """Declare, in a wrapper's class body, that the EAGLE-3 protocol is served by the attribute `attr`.

    Methods the class defines itself are kept (an explicit override wins over delegation).
    """

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def __set_name__(self, owner: type, name: str) -> None:
        for m in PROTOCOL_METHODS + ENGINE_METHODS:
            if m not in owner.__dict__:
                setattr(owner, m, _forwarder(m, self.attr, owner))
        owner.__eagle3_delegate__ = self.attr  # type: ignore[attr-defined]

    def __get__(self, obj: Any, objtype: type | None = None) -> "delegate_eagle3":
        return self


def implements_protocol(obj_or_cls: Any) -> bool:
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return all(callable(getattr(cls, m, None)) for m in PROTOCOL_METHODS)


@dataclass
class CheckReport:
    class_name: str
    missing: list[str] = field(default_factory=list)
    delegate_to: str | None = None  # attribute whose object implements the protocol
    delegate_class: str | None = None
    module_level: list[str] = field(default_factory=list)  # protocol names defined outside the class
    delegated_via: str | None = None

    @property
    def ok(self) -> bool:
        return not self.missing

    def message(self) -> str:
        if self.ok:
            how = f" (delegated to '{self.delegated_via}')" if self.delegated_via else ""
            return f"{self.class_name} implements the EAGLE-3 target protocol{how}."
        msg = (
            f"{self.class_name} does not implement the EAGLE-3 target protocol: missing "
            f"{', '.join(self.missing)}."
        )
        if self.module_level:
            msg += (
                f" {', '.join(self.module_level)} exist at module level in {self.class_name}'s module, outside the "
                "class (an appended patch?): they are not methods of the class."
            )
        if self.delegate_to:
            inner = f" ({self.delegate_class})" if self.delegate_class else ""
            msg += (
                f" Its attribute '{self.delegate_to}'{inner} implements the protocol: add "
                f"`eagle3 = delegate_eagle3(\"{self.delegate_to}\")` to the class body of {self.class_name} "
                f"(from eaglespec.protocol import delegate_eagle3)."
            )
        else:
            msg += " Define these methods in the class (see eaglespec.protocol)."
        return msg


def _inner_candidates_from_instance(obj: Any) -> list[tuple[str, type]]:
    found = []
    children = obj.named_children() if hasattr(obj, "named_children") else vars(obj).items()
    for name, child in children:
        if implements_protocol(child):
            found.append((name, type(child)))
    return found


def _inner_candidates_from_class(cls: type) -> list[tuple[str, type | None]]:
    """Attributes assigned in __init__ (`self.X = C(...)`), with C resolved in the class's module when possible."""
    found: list[tuple[str, type | None]] = []
    try:
        src = textwrap.dedent(inspect.getsource(cls.__init__))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError):
        return found
    module_globals = getattr(sys.modules.get(cls.__module__), "__dict__", {})
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for tgt in node.targets:
            if isinstance(tgt, ast.Attribute) and isinstance(tgt.value, ast.Name) and tgt.value.id == "self":
                ctor = None
                if isinstance(node.value, ast.Call):
                    f = node.value.func
                    ctor_name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    c = module_globals.get(ctor_name) if ctor_name else None
                    ctor = c if isinstance(c, type) else None
                found.append((tgt.attr, ctor))
    return found


def check_target(obj_or_cls: Any) -> CheckReport:
    """Static conformance check of a target model instance or class."""
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    report = CheckReport(class_name=cls.__qualname__)
    report.missing = [m for m in PROTOCOL_METHODS if not callable(getattr(cls, m, None))]
    report.delegated_via = getattr(cls, "__eagle3_delegate__", None)
    if report.ok:
        return report
    module = sys.modules.get(cls.__module__)
    if module is not None:
        report.module_level = [
            m for m in report.missing if inspect.isfunction(getattr(module, m, None))
        ]
    if not isinstance(obj_or_cls, type):
        cands = _inner_candidates_from_instance(obj_or_cls)
        if cands:
            report.delegate_to, c = cands[0]
            report.delegate_class = c.__qualname__
            return report
    for name, ctor in _inner_candidates_from_class(cls):
        if ctor is not None and implements_protocol(ctor):
            report.delegate_to, report.delegate_class = name, ctor.__qualname__
            return report
    for name, _ in _inner_candidates_from_class(cls):
        if name in CONVENTIONAL_INNER:
            report.delegate_to = name
            return report
    return report


def require_target(obj_or_cls: Any) -> None:
    """Raise ProtocolError with the report's message unless the model implements the protocol."""
    report = check_target(obj_or_cls)
    if not report.ok:
        raise ProtocolError(report.message())
