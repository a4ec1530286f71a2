"""What the mixture-of-experts decoders share (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): the router logits of every
MoE layer recorded (`output_router_logits`), the load-balancing loss (plus an optional router z-loss) added to the
LM loss when labels are given, the MoE output classes, and where a config puts its MoE layers.

Shapes: B batch, T time, P cached steps, N tokens (B * T), E experts.
"""

import torch
from transformers.modeling_outputs import MoeCausalLMOutputWithPast, MoeModelOutputWithPast

from .attention import Attention
from .block import Block
from .decoder import DecoderForCausalLM, DecoderModel, DecoderPreTrainedModel
from .feedforward import FeedForwardSpec
from .llama_like import gated_feedforward
from .moe import MoESpec, load_balancing_loss, router_z_loss
from .routers import RouterLogits


def sparse_layer(config, layer_idx: int) -> bool:
    """Whether a layer holds experts, as Qwen2-MoE and Qwen3-MoE decide it: every `decoder_sparse_step`-th layer,
    except those `mlp_only_layers` lists (the others are dense feed-forward layers)."""
    return (
        layer_idx not in config.mlp_only_layers
        and config.num_experts > 0
        and (layer_idx + 1) % config.decoder_sparse_step == 0
    )


class MoEDecoderPreTrainedModel(DecoderPreTrainedModel):
    # Blocks may be split so that one layer's experts land on different devices; every expert stays whole.
    _no_split_modules = ["TokenEmbeddings", "Attention", "GatedFeedForward"]
    # In stock's order, which a tuple output (`return_dict=False`) follows: the router logits first.
    _can_record_outputs = {"router_logits": RouterLogits, "hidden_states": Block, "attentions": Attention}


class MoEDecoderModel(DecoderModel):
    output_class = MoeModelOutputWithPast


def _rows_of_last_steps(attention_mask: torch.Tensor | None, tokens: int) -> torch.Tensor | None:
    """The [B, P + T] padding mask cut to the T steps the router saw (N = B*T rows); 4D masks (and generate's
    dict of them) are not per token."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        return None
    steps = tokens // attention_mask.shape[0]
    return attention_mask[:, -steps:]


class MoEDecoderForCausalLM(DecoderForCausalLM):
    output_class = MoeCausalLMOutputWithPast

    def __init__(self, config):
        super().__init__(config)
        # Stock's attributes, which its loss reads: set once here, so that a user's `model.router_aux_loss_coef = x`
        # takes effect and a config field changed after loading does not, as in stock (the routing's top k is fixed
        # when the layers are built, and the loss counts the experts the routing chose).
        self.router_aux_loss_coef = config.router_aux_loss_coef
        self.num_experts = config.num_experts
        self.num_experts_per_tok = config.num_experts_per_tok

    def auxiliary_outputs(self, outputs, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor | None, dict]:
        """Stock's load-balancing loss over the MoE layers' router logits (dense layers and a shared expert
        route nothing, and count for nothing), times `router_aux_loss_coef`."""
        router_logits = outputs.router_logits
        if not router_logits:  # recorded only with output_router_logits
            return None, {}
        mask = _rows_of_last_steps(attention_mask, router_logits[0].shape[0])
        aux_loss = load_balancing_loss(router_logits, self.num_experts_per_tok, mask, self.data_parallel_group)
        loss = self.router_aux_loss_coef * aux_loss
        if self.config.router_z_loss_coef:
            loss = loss + self.config.router_z_loss_coef * router_z_loss(router_logits, mask)
        return loss, {"aux_loss": aux_loss, "router_logits": router_logits}


def qwen_style_experts(config, expert_size: int, shared_expert_size: int = 0) -> MoESpec:
    """The mixture of Qwen2-MoE, Qwen3-MoE and OLMoE: softmax over all experts, the top k renormalised as
    `norm_topk_prob` says, the weights in the activations' dtype; a shared expert where a width is given."""
    return MoESpec(
        hidden_size=config.hidden_size,
        expert_size=expert_size,
        num_experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        activation=config.hidden_act,
        routing="softmax_top_k_in_logits_dtype",
        norm_topk_prob=config.norm_topk_prob,
        shared_expert_size=shared_expert_size,
    )


def qwen_style_feedforward(config, layer_idx: int) -> FeedForwardSpec | MoESpec:
    """Qwen2-MoE's and Qwen3-MoE's layer `layer_idx`: the Llama-like dense feed-forward where `sparse_layer` says
    no, else the mixture, beside a shared expert where the config gives one a width."""
    if not sparse_layer(config, layer_idx):
        return gated_feedforward(config, layer_idx)
    shared = getattr(config, "shared_expert_intermediate_size", 0)
    return qwen_style_experts(config, config.moe_intermediate_size, shared)
