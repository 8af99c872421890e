"""User-facing errors.

Contract: every mistake a user can make (bad path, corrupt checkpoint, mismatched drafter, out-of-range sampling
parameter, prompt too long, a wrapper without the EAGLE-3 protocol) raises `EaglespecError` (or a subclass) with one
clear sentence. The CLI prints that sentence and exits non-zero; the server answers HTTP 400. Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class EaglespecError(Exception):
    """A user mistake, reported as one sentence without a traceback."""


class CheckpointError(EaglespecError):
    """A checkpoint file is missing, corrupt, or of a kind we do not read."""


class ConfigError(EaglespecError):
    """A configuration value is missing, unknown or out of range."""


class ProtocolError(EaglespecError):
    """A target model does not implement the EAGLE-3 target protocol."""


class DrafterMismatchError(EaglespecError):
    """A drafter does not fit its target (hidden size, vocabulary, aux layers)."""


class RequestError(EaglespecError):
    """A generation request is invalid (prompt too long, sampling parameter out of range)."""


class DeviceMemoryError(EaglespecError):
    """The device lacks the memory a model needs (its weights alone exceed what is free)."""
