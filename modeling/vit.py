"""ViT: an image as a sequence of patch tokens, then BERT's blocks in pre-norm, a final norm and a [CLS] head.

The recipe maps the stock `ViTConfig` fields onto shared parts: only the embeddings (patches, [CLS], interpolated
positions), the norm placement and the head differ from BERT.

Shapes: B batch, Ch image channels, Hi/Wi image height/width, T = 1 + patches, C channels, L labels.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from ..configuration.validation import pair
from ..configuration.vit import FivefoldViTConfig
from .attention import Attention
from .bert_style import bert_style_block
from .block import Block, BlockSpec
from .encoder import check_attention_mask
from .heads import Pooler
from .linear import Linear
from .losses import sequence_classification_loss
from .norms import build_norm
from .patch_embeddings import PatchEmbeddings, PatchEmbeddingSpec
from .pretrained import FivefoldPreTrainedModel


@dataclass(frozen=True)
class ViTRecipe:
    embeddings: PatchEmbeddingSpec
    blocks: tuple[BlockSpec, ...]
    final_norm: str
    norm_eps: float
    pooler_size: int
    pooler_act: str


def vit_recipe(config) -> ViTRecipe:
    block = bert_style_block(config, prenorm=True, qkv_bias=config.qkv_bias)
    return ViTRecipe(
        embeddings=PatchEmbeddingSpec(
            image_size=pair(config.image_size, "image_size"),
            patch_size=pair(config.patch_size, "patch_size"),
            num_channels=config.num_channels,
            hidden_size=config.hidden_size,
            dropout=config.hidden_dropout_prob,
        ),
        blocks=(block,) * config.num_hidden_layers,
        final_norm="layernorm",
        norm_eps=config.layer_norm_eps,
        pooler_size=config.pooler_output_size or config.hidden_size,
        pooler_act=config.pooler_act,
    )


class FivefoldViTPreTrainedModel(FivefoldPreTrainedModel):
    config: FivefoldViTConfig
    recipe = staticmethod(vit_recipe)
    base_model_prefix = "model"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["PatchEmbeddings", "Block"]
    _can_record_outputs = {"hidden_states": Block, "attentions": Attention}

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        # The learned [CLS] token and positions are bare parameters, which the generic init does not reach.
        if isinstance(module, PatchEmbeddings):
            init.trunc_normal_(module.cls_token, mean=0.0, std=self.config.initializer_range)
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=self.config.initializer_range)


class FivefoldViTModel(FivefoldViTPreTrainedModel):
    def __init__(self, config, add_pooling_layer: bool = True):
        super().__init__(config)
        recipe = self.recipe(config)
        self.embeddings = PatchEmbeddings(recipe.embeddings)
        self.layers = nn.ModuleList(Block(config, spec, i) for i, spec in enumerate(recipe.blocks))
        self.norm = build_norm(recipe.final_norm, config.hidden_size, recipe.norm_eps)
        self.pooler = Pooler(config.hidden_size, recipe.pooler_size, recipe.pooler_act) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Conv2d:
        return self.embeddings.patch_proj

    # hidden_states[-1] is the last block's output before the final norm, as in stock ViT.
    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,  # [B, Ch, Hi, Wi]
        interpolate_pos_encoding: bool | None = None,  # True: accept image sizes other than config.image_size
        attention_mask: torch.Tensor | None = None,  # [B, T], 1 = attend (rarely used: every patch is real)
        **kwargs,
    ) -> BaseModelOutputWithPooling:
        hidden = self.embeddings(pixel_values, bool(interpolate_pos_encoding))  # [B, T, C]
        check_attention_mask(attention_mask, hidden.shape[0], hidden.shape[1])
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask)
        for layer in self.layers:
            hidden = layer(hidden, mask, **kwargs)
        hidden = self.norm(hidden)
        pooled = self.pooler(hidden) if self.pooler is not None else None  # [B, pooler_output_size]
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=pooled)


class FivefoldViTForImageClassification(FivefoldViTPreTrainedModel):
    """A linear classifier on the final [CLS] token; single-label, multi-label or regression losses as stock."""

    _keys_to_ignore_on_load_unexpected = [r"^model\.pooler\."]

    def __init__(self, config):
        super().__init__(config)
        self.model = FivefoldViTModel(config, add_pooling_layer=False)
        self.classifier = Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,  # [B, Ch, Hi, Wi]
        labels: torch.Tensor | None = None,  # [B] (class ids), [B] or [B, L] floats (regression, multi-label)
        interpolate_pos_encoding: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> ImageClassifierOutput:
        num_items = kwargs.pop("num_items_in_batch", None)
        kwargs.pop("return_dict", None)
        out = self.model(
            pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            attention_mask=attention_mask,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(out.last_hidden_state[:, 0])  # [B, L]
        loss = sequence_classification_loss(logits, labels, self.config, num_items) if labels is not None else None
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
