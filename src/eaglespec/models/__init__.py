"""Registry: HF `architectures` names -> model classes (imported lazily, so adding one is one line here)."""

from __future__ import annotations

import importlib

from ..errors import ConfigError

_REGISTRY: dict[str, str] = {
    "LlamaForCausalLM": "eaglespec.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "eaglespec.models.llama:LlamaForCausalLM",
    "Ministral3ForCausalLM": "eaglespec.models.llama:LlamaForCausalLM",
    "SmolLM3ForCausalLM": "eaglespec.models.llama:LlamaForCausalLM",
    "SeedOssForCausalLM": "eaglespec.models.llama:LlamaForCausalLM",
    "Ernie4_5ForCausalLM": "eaglespec.models.llama:Ernie4_5ForCausalLM",
    "Ernie4_5_MoeForCausalLM": "eaglespec.models.qwen_moe:Ernie4_5_MoeForCausalLM",
    "GraniteForCausalLM": "eaglespec.models.granite:GraniteForCausalLM",
    "Qwen2ForCausalLM": "eaglespec.models.qwen:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "eaglespec.models.qwen:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "eaglespec.models.qwen_moe:Qwen3MoeForCausalLM",
    "Qwen2MoeForCausalLM": "eaglespec.models.qwen_moe:Qwen2MoeForCausalLM",
    "OlmoeForCausalLM": "eaglespec.models.qwen_moe:OlmoeForCausalLM",
    "MixtralForCausalLM": "eaglespec.models.mixtral:MixtralForCausalLM",
    "MiniMaxM2ForCausalLM": "eaglespec.models.minimax_m2:MiniMaxM2ForCausalLM",
    "Phi3ForCausalLM": "eaglespec.models.phi3:Phi3ForCausalLM",
    "CohereForCausalLM": "eaglespec.models.cohere:CohereForCausalLM",
    "Cohere2ForCausalLM": "eaglespec.models.cohere:Cohere2ForCausalLM",
    "Olmo2ForCausalLM": "eaglespec.models.olmo2:Olmo2ForCausalLM",
    "Olmo3ForCausalLM": "eaglespec.models.olmo2:Olmo2ForCausalLM",
    "Exaone4ForCausalLM": "eaglespec.models.olmo2:Exaone4ForCausalLM",
    "Glm4ForCausalLM": "eaglespec.models.glm4:Glm4ForCausalLM",
    "Glm4MoeForCausalLM": "eaglespec.models.glm4_moe:Glm4MoeForCausalLM",
    "Gemma2ForCausalLM": "eaglespec.models.gemma:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "eaglespec.models.gemma:Gemma3ForCausalLM",
    "GptOssForCausalLM": "eaglespec.models.gpt_oss:GptOssForCausalLM",
    "Gemma3ForConditionalGeneration": "eaglespec.models.gemma:Gemma3ForConditionalGeneration",
    "Llama4ForCausalLM": "eaglespec.models.llama4:Llama4ForCausalLM",
    "Llama4ForConditionalGeneration": "eaglespec.models.llama4:Llama4ForConditionalGeneration",
    "LlamaForCausalLMEagle3": "eaglespec.models.eagle3:LlamaForCausalLMEagle3",
    "DeepseekV2ForCausalLM": "eaglespec.models.deepseek_v3:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "eaglespec.models.deepseek_v3:DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM": "eaglespec.models.deepseek_v3:DeepseekV32ForCausalLM",
    "Glm4MoeLiteForCausalLM": "eaglespec.models.deepseek_v3:DeepseekV3ForCausalLM",
    "KimiK25ForConditionalGeneration": "eaglespec.models.kimi_k25:KimiK25ForConditionalGeneration",
    "Mistral3ForConditionalGeneration": "eaglespec.models.mistral3:Mistral3ForConditionalGeneration",
}


def supported_architectures() -> list[str]:
    return sorted(_REGISTRY)


def register(architecture: str, target: str) -> None:
    """Register `module:Class` under an `architectures` name (for user models)."""
    _REGISTRY[architecture] = target


def get_model_class(architecture: str) -> type:
    try:
        target = _REGISTRY[architecture]
    except KeyError:
        raise ConfigError(
            f"unknown architecture {architecture!r} (supported: {', '.join(supported_architectures())})"
        ) from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
