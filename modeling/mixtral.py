"""Mixtral: RMSNorm pre-norm blocks, rotary positions, grouped-query causal attention (optionally a sliding
window), and a mixture of SwiGLU experts in place of the feed-forward layer.

The recipe maps the stock `MixtralConfig` fields onto shared parts; the classes below are one-line wirings.
The router logits of every layer are recorded (`output_router_logits`) and turned into Mixtral's
load-balancing loss (plus an optional router z-loss), added to the LM loss when labels are given.

Shapes: B batch, T time, P cached steps, N tokens (B * T), E experts.
"""

import torch
from transformers.modeling_outputs import MoeCausalLMOutputWithPast, MoeModelOutputWithPast

from ..configuration.mixtral import FivefoldMixtralConfig
from .attention import Attention
from .block import Block
from .decoder import (
    DecoderForCausalLM,
    DecoderForSequenceClassification,
    DecoderModel,
    DecoderPreTrainedModel,
)
from .llama_like import llama_like_recipe
from .moe import MoESpec, load_balancing_loss, router_z_loss
from .routers import RouterLogits
from .stack import Recipe


def mixtral_experts(config, layer_idx: int) -> MoESpec:
    return MoESpec(
        hidden_size=config.hidden_size,
        expert_size=config.intermediate_size,
        num_experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        activation=config.hidden_act,
        jitter_noise=config.router_jitter_noise,
    )


def mixtral_recipe(config) -> Recipe:
    return llama_like_recipe(config, mixtral_experts)


class FivefoldMixtralPreTrainedModel(DecoderPreTrainedModel):
    config: FivefoldMixtralConfig
    recipe = staticmethod(mixtral_recipe)
    # Blocks may be split so that one layer's experts land on different devices; every expert stays whole.
    _no_split_modules = ["TokenEmbeddings", "Attention", "GatedFeedForward"]
    _can_record_outputs = {"hidden_states": Block, "attentions": Attention, "router_logits": RouterLogits}


class FivefoldMixtralModel(FivefoldMixtralPreTrainedModel, DecoderModel):
    output_class = MoeModelOutputWithPast


def _rows_of_last_steps(attention_mask: torch.Tensor | None, tokens: int) -> torch.Tensor | None:
    """The [B, P + T] padding mask cut to the T steps the router saw (N = B*T rows); 4D masks (and generate's
    dict of them) are not per token."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        return None
    steps = tokens // attention_mask.shape[0]
    return attention_mask[:, -steps:]


class FivefoldMixtralForCausalLM(FivefoldMixtralPreTrainedModel, DecoderForCausalLM):
    base_model_class = FivefoldMixtralModel
    output_class = MoeCausalLMOutputWithPast

    def auxiliary_outputs(self, outputs, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor | None, dict]:
        router_logits = outputs.router_logits
        if not router_logits:  # recorded only with output_router_logits
            return None, {}
        mask = _rows_of_last_steps(attention_mask, router_logits[0].shape[0])
        aux_loss = load_balancing_loss(router_logits, self.config.num_experts_per_tok, mask, self.data_parallel_group)
        loss = self.config.router_aux_loss_coef * aux_loss
        if self.config.router_z_loss_coef:
            loss = loss + self.config.router_z_loss_coef * router_z_loss(router_logits, mask)
        return loss, {"aux_loss": aux_loss, "router_logits": router_logits}


class FivefoldMixtralForSequenceClassification(FivefoldMixtralPreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldMixtralModel
