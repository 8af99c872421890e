"""vLLM speculators' EAGLE-3 drafter format, read into `ModelConfig`: the one place that knows its config.

`ModelConfig.from_hf` hands a config.json with `speculators_model_type` or `transformer_layer_config` to
`from_speculators(d)`, which rewrites it as the EAGLE-3 layout's flat config (`eagle3_layout`, the one SGLang,
SpecForge and `eaglespec train` write) and reads that, so every default keeps its one home in config.py. The weights
load through `LlamaForCausalLMEagle3.checkpoint_renames` (`layers.0.` -> `midlayer.`; later layers keep `layers.i.`).

The format, as speculators writes it (github.com/vllm-project/speculators, src/speculators/: models/eagle3/config.py
`Eagle3SpeculatorConfig`, models/eagle3/core.py `Eagle3DraftModel`, model.py `DraftVocabMixin`, and
convert/eagle/eagle3_legacy_model.py `Eagle3Speculator`, which its converter saves) and vLLM reads it
(vllm/transformers_utils/configs/speculators/, vllm/model_executor/models/llama_eagle3.py):
- top level: `speculators_model_type` "eagle3", `architectures` ["Eagle3DraftModel"] or ["Eagle3Speculator"],
  `draft_vocab_size`, `norm_before_residual`, `target_hidden_size` (null: the layer's hidden_size),
  `eagle_aux_hidden_state_layer_ids` (null: the default layers), EAGLE-3.1's `norm_before_fc` / `fc_norm` /
  `norm_output`, `embed_requires_grad`, and `speculators_config` {algorithm, proposal_methods [{speculative_tokens,
  ...}], default_proposal_method, verifier {name_or_path, architectures}};
- `transformer_layer_config`: the decoder layer's transformers config (model_type, hidden_size, intermediate_size,
  heads, head_dim, rms_norm_eps, rope, num_hidden_layers; vocab_size is the verifier's vocabulary);
- weights: fc.weight; layers.0.{input_layernorm, hidden_norm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
  mlp.{gate,up,down}_proj}.weight; with num_hidden_layers N > 1 also layers.1..N-1, plain Llama decoder layers
  (transformers' LlamaDecoderLayer: no hidden_norm, input width H); norm.weight; lm_head.weight [draft_vocab_size, H]; d2t [draft_vocab_size] and t2d
  [vocab_size] only when the draft vocabulary is smaller than the verifier's (target id = draft id + d2t[id], as in
  the EAGLE-3 layout); input_norm.weight or fc_norm.{i}.weight (EAGLE-3.1); embed_tokens.weight, a frozen copy of
  the verifier's embedding, ignored as the EAGLE-3 layout's is (the drafter takes the target's).

Read as:
- the layer's fields become the flat config's, and `architectures` LlamaForCausalLMEagle3;
- `draft_vocab_size` equal to the layer's vocab_size: no draft vocabulary (Eagle3Config.draft_vocab_size None, so the
  target's lm_head, of which speculators' lm_head is a frozen copy, and no d2t / t2d, which it then does not save);
- `eagle_aux_hidden_state_layer_ids` in vLLM's convention (id k = the hidden state after k layers: speculators'
  scripts/launch_vllm.py hands them to vLLM to capture the training data, and its default [2, N//2, N-3] is
  EAGLE-3's [1, N//2-1, N-4] there) -> the protocol's (k - 1); Eagle3Config.aux_ids_fixed then keeps
  EngineConfig.aux_convention off them;
- `norm_before_residual`, `norm_before_fc`, `fc_norm`, `norm_output`: Eagle3Config's fields of those names.
Refused with one sentence naming the field, since each changes what the drafter computes and eaglespec's drafter does
not compute it: another speculators_model_type; a layer other than llama's (speculators reads a missing model_type as
qwen3, whose attention has q/k norms); sliding-window layers; a trained embedding
(`embed_requires_grad`); aux ids other than three, or id 0 (the embedding output); and a config that leaves out
`draft_vocab_size` or `norm_before_residual`, whose defaults speculators and vLLM disagree on (32000 against the
verifier's vocabulary; false against true).
Ignored, as they leave the drafter's function alone: `speculators_config` (speculative_tokens is vLLM's default draft
length; eaglespec takes --spec), `speculators_version`, `auto_map`, `tie_word_embeddings` (the head is never tied);
`dtype` / `torch_dtype` become torch_dtype.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from .config import EAGLE31_FLAGS, ModelConfig
from .errors import ConfigError

# fields whose default speculators (its pydantic config) and vLLM (its reader, when the key is absent) disagree on
_STATED = {"draft_vocab_size": "32000 against the verifier's vocabulary", "norm_before_residual": "false against true"}


def is_speculators(d: Mapping[str, Any]) -> bool:
    """Whether a config.json dict is in speculators' format."""
    return "speculators_model_type" in d or "transformer_layer_config" in d


def from_speculators(d: Mapping[str, Any]) -> ModelConfig:
    """A speculators-format drafter config -> its ModelConfig (raw: `d` itself), or a ConfigError naming the field."""
    cfg = ModelConfig.from_hf(eagle3_layout(d))
    assert cfg.eagle is not None
    return cfg.with_(eagle=replace(cfg.eagle, aux_ids_fixed=True), raw=dict(d))


def eagle3_layout(d: Mapping[str, Any]) -> dict[str, Any]:
    """The EAGLE-3 layout's config.json dict equivalent to the speculators config `d` (module docstring)."""
    kind = d.get("speculators_model_type")
    if kind != "eagle3":
        raise ConfigError(f"the drafter's speculators_model_type is {kind!r}: eaglespec reads speculators' eagle3 "
                          "drafters only")
    layer = d.get("transformer_layer_config")
    if not isinstance(layer, Mapping):
        raise ConfigError("the speculators config lacks transformer_layer_config, the drafter layer's fields")
    if layer.get("model_type") != "llama":
        raise ConfigError(f"the drafter's transformer_layer_config.model_type is {layer.get('model_type')!r}: "
                          "eaglespec's drafter layer is llama's (speculators reads a missing model_type as qwen3, "
                          "whose attention has q/k norms)")
    if any(t != "full_attention" for t in layer.get("layer_types") or ()):
        raise ConfigError("the drafter's transformer_layer_config.layer_types has sliding-window layers, which "
                          "eaglespec's drafter does not run")
    for name, why in _STATED.items():
        if d.get(name) is None:
            raise ConfigError(f"the speculators config does not state {name}, whose default speculators and vLLM "
                              f"read differently ({why}): add it to config.json")
    if d.get("embed_requires_grad"):
        raise ConfigError("the drafter sets embed_requires_grad (its embedding was trained): eaglespec's drafter "
                          "takes the target's embedding")
    ids = d.get("eagle_aux_hidden_state_layer_ids")  # vLLM's convention: id k = after k layers
    if ids:
        if len(ids) != 3:
            raise ConfigError(f"the drafter's eagle_aux_hidden_state_layer_ids {list(ids)} are not three: eaglespec's "
                              "drafter takes three aux layers")
        if min(int(i) for i in ids) < 1:
            raise ConfigError(f"the drafter's eagle_aux_hidden_state_layer_ids {list(ids)} include 0, the embedding "
                              "output (vLLM's convention), which eaglespec's targets do not capture")
    flat = {k: v for k, v in layer.items() if k != "architectures"}
    draft_vocab = int(d["draft_vocab_size"])
    flat.update(
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=None if draft_vocab == layer.get("vocab_size") else draft_vocab,
        target_hidden_size=d.get("target_hidden_size"),
        eagle_config={"eagle_aux_hidden_state_layer_ids": [int(i) - 1 for i in ids]} if ids else {},
        norm_before_residual=bool(d["norm_before_residual"]),
        **{name: bool(d.get(name, False)) for name in EAGLE31_FLAGS},
    )
    dtype = d.get("torch_dtype") or d.get("dtype")
    if dtype:
        flat["torch_dtype"] = dtype
    return flat
