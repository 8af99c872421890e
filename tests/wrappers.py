"""Test wrappers around a tiny Llama: a multimodal-style wrapper (vision stub + projector + language_model)
without delegation, the same with `delegate_eagle3`, and the appended-patch bug (protocol functions written at module
level after the class, as `cat >>` onto the module would)."""

from __future__ import annotations

from torch import nn

from eaglespec.models.llama import LlamaForCausalLM
from eaglespec.protocol import delegate_eagle3


class VisionStub(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)


class WrapperBase(nn.Module):
    def __init__(self, language_model: LlamaForCausalLM) -> None:
        super().__init__()
        self.vision_tower = VisionStub(8)
        self.mm_projector = nn.Linear(8, language_model.config.hidden_size)
        self.language_model = language_model
        self.config = language_model.config

    def forward(self, input_ids, ctx, inputs_embeds=None):
        return self.language_model(input_ids, ctx, inputs_embeds=inputs_embeds)


class PlainWrapper(WrapperBase):
    """Forgets the protocol."""


class DelegatingWrapper(WrapperBase):
    eagle3 = delegate_eagle3("language_model")


class PatchedWrapper(WrapperBase):
    """The protocol methods below were appended at module level, outside this class."""


EntryClass = [PatchedWrapper]


def get_embed_and_head(self):
    return self.language_model.get_embed_and_head()


def set_embed_and_head(self, embed, head):
    return self.language_model.set_embed_and_head(embed, head)


def set_eagle3_layers_to_capture(self, layer_ids):
    return self.language_model.set_eagle3_layers_to_capture(layer_ids)
