"""ViT: an image as a sequence of patch tokens, then BERT's blocks in pre-norm, a final norm and a [CLS] head.

The recipe maps the stock `ViTConfig` fields onto shared parts: only the embeddings (patches, [CLS], interpolated
positions), the norm placement and the pooler's width and activation differ from BERT.
"""

from torch import nn
from transformers import initialization as init

from ..configuration.validation import pair
from ..configuration.vit import FivefoldViTConfig
from .bert import bert_block
from .encoder import EncoderPreTrainedModel, ImageEncoderModel
from .encoder_tasks import EncoderForImageClassification
from .heads import HeadSpec, TransformSpec
from .patch_embeddings import PatchEmbeddings, PatchEmbeddingSpec
from .stack import Recipe, StackSpec
from .tasks import stock_name_of_the_base


def vit_recipe(config) -> Recipe:
    pooler = TransformSpec(config.pooler_act, out_size=config.pooler_output_size or config.hidden_size)
    return Recipe(
        stack=StackSpec(
            embeddings=PatchEmbeddingSpec(
                image_size=pair(config.image_size, "image_size"),
                patch_size=pair(config.patch_size, "patch_size"),
                num_channels=config.num_channels,
                hidden_size=config.hidden_size,
                dropout=config.hidden_dropout_prob,
            ),
            blocks=(bert_block(config, prenorm=True, qkv_bias=config.qkv_bias),) * config.num_hidden_layers,
            norm="layernorm",
            norm_eps=config.layer_norm_eps,
            pooler=HeadSpec(pool="first", transform=pooler),
        ),
        heads={"image_classification": HeadSpec(pool="first", at="classifier")},
    )


class FivefoldViTPreTrainedModel(EncoderPreTrainedModel):
    config: FivefoldViTConfig
    vit = stock_name_of_the_base()
    recipe = staticmethod(vit_recipe)
    main_input_name = "pixel_values"
    input_modalities = ("image",)

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        # The learned [CLS] token and positions are bare parameters, which the generic init does not reach.
        if isinstance(module, PatchEmbeddings):
            init.trunc_normal_(module.cls_token, mean=0.0, std=self.config.initializer_range)
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=self.config.initializer_range)


class FivefoldViTModel(FivefoldViTPreTrainedModel, ImageEncoderModel):
    pass


class FivefoldViTForImageClassification(FivefoldViTPreTrainedModel, EncoderForImageClassification):
    base_model_class = FivefoldViTModel
