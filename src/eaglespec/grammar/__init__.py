"""Structured outputs: an answer held to a JSON schema, a regular expression, a list of choices or a grammar.

- `output_format.StructuredOutput`: what a request asks for (frozen, validated; part of `SamplingParams`);
- `token_grammar.TokenGrammar`: a request's grammar state over token ids, the interface the engine reads (masks of
  the tokens that may come next, tentative consumption with rollback for draft paths, commitment);
- `compiler.GrammarCompiler`: StructuredOutput -> TokenGrammar through llguidance, per engine tokenizer.
"""

from .output_format import StructuredOutput
from .token_grammar import TokenGrammar

__all__ = ["StructuredOutput", "TokenGrammar"]
