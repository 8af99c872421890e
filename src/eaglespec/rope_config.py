"""`RopeConfig`: a model's rotary position embedding, read from its config.json (`rope_scaling` / transformers 5's
`rope_parameters`): default, linear, llama3, yarn and longrope (Phi-3's, "su" in its first configs); any other type
is a `ConfigError`. `partial_rotary_factor` (Phi-4-mini's 0.75, GLM-4's 0.5) is the fraction of each head's dims that
RoPE rotates (`ModelConfig.rotary_dim`). `layers/rotary.py` turns it into frequencies; `ModelConfig` (config.py) holds
one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import ConfigError


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding. `type` is one of default, linear, llama3, yarn."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None  # yarn / longrope cos/sin scale; None: derived as transformers does
    truncate: bool = True  # yarn: round the correction range to whole dims
    # longrope (Phi-3's 128K variants): per-frequency divisors up to original_max_position_embeddings (the short
    # factors, the only ones used: see ModelConfig.context_limit) and past it (long)
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    # the fraction of each head's dims rotated (the first ones; the rest pass through), as transformers' rotary
    # embeddings read it: at the top of the config (transformers 4) or in rope_parameters (transformers 5)
    partial_rotary_factor: float = 1.0

    @staticmethod
    def from_hf(d: Mapping[str, Any], partial_default: float = 1.0) -> "RopeConfig":
        """`partial_default`: the factor when the config names none (transformers' GLM-4 configs default to 0.5)."""
        theta = float(d.get("rope_theta", 10000.0))
        rs = d.get("rope_scaling") or d.get("rope_parameters") or {}
        if "rope_theta" in rs:  # transformers 5 folds theta into rope_parameters
            theta = float(rs["rope_theta"])
        rtype = rs.get("rope_type", rs.get("type", "default")) or "default"
        rtype = {"su": "longrope"}.get(rtype, rtype)  # Phi-3's first configs name LongRoPE "su"
        known = ("default", "linear", "llama3", "yarn", "longrope")
        if rtype not in known:
            raise ConfigError(f"rope_scaling type {rtype!r} is not supported (supported: {', '.join(known)})")
        original = int(rs.get("original_max_position_embeddings", d.get("original_max_position_embeddings",
                                                                        d.get("max_position_embeddings", 8192))))
        factor = rs.get("factor")
        if rtype == "longrope" and factor is None:  # Phi-3's convention: the positions' ratio
            factor = int(d.get("max_position_embeddings", original)) / original
        return RopeConfig(
            theta=theta,
            type=rtype,
            factor=float(factor if factor is not None else 1.0),
            low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=original,
            beta_fast=float(rs.get("beta_fast", 32.0)),
            beta_slow=float(rs.get("beta_slow", 1.0)),
            mscale=float(rs.get("mscale", 1.0)),
            mscale_all_dim=float(rs.get("mscale_all_dim", 0.0)),
            attention_factor=float(rs["attention_factor"]) if rs.get("attention_factor") is not None else None,
            truncate=bool(rs.get("truncate", True)),
            short_factor=tuple(float(x) for x in rs.get("short_factor") or ()),
            long_factor=tuple(float(x) for x in rs.get("long_factor") or ()),
            partial_rotary_factor=float(rs.get("partial_rotary_factor")
                                        or d.get("partial_rotary_factor") or partial_default),
        )

    def to_hf(self) -> dict[str, Any] | None:
        """The `rope_scaling` dict of this rope (None for the default one; `partial_rotary_factor` is not in it)."""
        if self.type == "default":
            return None
        out: dict[str, Any] = {"rope_type": self.type, "factor": self.factor}
        if self.type == "llama3":
            out.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        if self.type == "longrope":
            out.update(short_factor=list(self.short_factor), long_factor=list(self.long_factor),
                       original_max_position_embeddings=self.original_max_position_embeddings)
            if self.attention_factor is not None:
                out["attention_factor"] = self.attention_factor
        if self.type == "yarn":
            out.update(
                beta_fast=self.beta_fast,
                beta_slow=self.beta_slow,
                mscale=self.mscale,
                mscale_all_dim=self.mscale_all_dim,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        return out
