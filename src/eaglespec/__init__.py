"""eaglespec: EAGLE-3 speculative decoding for any target model, and the drafters it needs.

`eaglespec.load(model, draft, spec, config)` builds an engine (see api.py); the CLI is `eaglespec.cli`.
"""

__version__ = "0.1.0"


def load(*args, **kwargs):
    """Build an engine; see `eaglespec.api.load`."""
    from .api import load as _load

    return _load(*args, **kwargs)
