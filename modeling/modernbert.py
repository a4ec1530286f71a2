"""ModernBERT: rotary positions with a base per layer type, global attention every few layers and a sliding
window between, GeGLU feed-forward, pre-norm LayerNorms without bias, an embedding norm and a final norm.

Its task heads share one transform, `head` (dense -> activation -> norm), before a dropout and the task's
projection (`decoder` for the masked LM, `classifier` for the others); classifiers pool the [CLS] token or the
mean of the real tokens (`classifier_pooling`).
"""

import math

from transformers.modeling_outputs import BaseModelOutput

from ..configuration.modernbert import FivefoldModernBertConfig
from .attention import AttentionSpec
from .block import BlockSpec
from .embeddings import EmbeddingSpec
from .encoder import EncoderModel, EncoderPreTrainedModel
from .encoder_tasks import (
    EncoderForMaskedLM,
    EncoderForMultipleChoice,
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from .feedforward import FeedForwardSpec
from .heads import HeadSpec, TransformSpec
from .initialization import WeightInit, mark_projections
from .stack import Recipe, StackSpec

# classifier_pooling -> the pool of a sequence classifier, and of a multiple-choice scorer (whose choices may
# be left-padded, so "cls" is the first real token there, as in stock).
SEQUENCE_POOLS = {"cls": "first", "mean": "mean"}
CHOICE_POOLS = {"cls": "first_real", "mean": "mean"}


def modernbert_recipe(config) -> Recipe:
    norm = "layernorm" if config.norm_bias else "layernorm_nobias"

    def block(index: int, layer_type: str) -> BlockSpec:
        sliding = layer_type == "sliding_attention"
        return BlockSpec(
            attention=AttentionSpec(
                hidden_size=config.hidden_size,
                num_heads=config.num_attention_heads,
                bias=config.attention_bias,
                out_bias=config.attention_bias,
                dropout=config.attention_dropout,
                positions="rotary",
                rotary_theta=config.rope_parameters[layer_type]["rope_theta"],
                # `local_attention` is the whole window: keys within half of it on either side.
                window=config.local_attention // 2 if sliding else None,
            ),
            feedforward=FeedForwardSpec(
                kind="gated",
                hidden_size=config.hidden_size,
                intermediate_size=config.intermediate_size,
                activation=config.hidden_activation,
                bias=config.mlp_bias,
                dropout=config.mlp_dropout,
            ),
            norm=norm,
            norm_eps=config.norm_eps,
            prenorm=True,
            dropout=config.attention_dropout,  # stock drops the attention output with the attention rate
            mlp_out_dropout=0.0,
            attn_input_norm=index > 0,  # the embedding norm already normalised the first block's input
        )

    transform = TransformSpec(config.classifier_activation, norm, config.norm_eps, bias=config.classifier_bias)
    # Fresh heads as stock draws them: the transform and the decoder as output layers (scaled by depth), the
    # classifiers by the width.
    cutoff = config.initializer_cutoff_factor or 3.0
    out_init = WeightInit(config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers), cutoff)
    classifier_init = WeightInit(config.hidden_size**-0.5, cutoff)

    def head(at: str, pool: str = "none", dropout: float = config.classifier_dropout, bias: bool = True) -> HeadSpec:
        projection_init = out_init if at == "decoder" else classifier_init
        inits = dict(transform_init=out_init, projection_init=projection_init)
        return HeadSpec(pool, transform, dropout, at=at, bias=bias, **inits)

    return Recipe(
        stack=StackSpec(
            embeddings=EmbeddingSpec(
                vocab_size=config.vocab_size,
                hidden_size=config.hidden_size,
                padding_idx=config.pad_token_id,
                norm=norm,
                norm_eps=config.norm_eps,
                dropout=config.embedding_dropout,
            ),
            # The first num_hidden_layers, as stock builds them: `from_pretrained(..., num_hidden_layers=n)` sets
            # the count after the config checked it against layer_types, which still lists every layer.
            blocks=tuple(block(i, kind) for i, kind in enumerate(config.layer_types[: config.num_hidden_layers])),
            norm=norm,
            norm_eps=config.norm_eps,
        ),
        heads={
            "masked_lm": head("decoder", dropout=0.0, bias=config.decoder_bias),
            "sequence_classification": head("classifier", SEQUENCE_POOLS[config.classifier_pooling]),
            "token_classification": head("classifier"),
            "question_answering": head("classifier"),
            "multiple_choice": head("classifier", CHOICE_POOLS[config.classifier_pooling]),
        },
        sparse_prediction=config.sparse_pred_ignore_index if config.sparse_prediction else None,
    )


class FivefoldModernBertPreTrainedModel(EncoderPreTrainedModel):
    config: FivefoldModernBertConfig
    recipe = staticmethod(modernbert_recipe)

    def post_init(self) -> None:
        # Stock's truncated normals: inputs at initializer_range, the residual outputs smaller by 1/sqrt(2 layers).
        c = self.config
        cutoff = c.initializer_cutoff_factor or 3.0
        inputs = WeightInit(c.initializer_range, cutoff)
        outputs = WeightInit(c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers), cutoff)
        mark_projections(self, query=inputs, key_value=inputs, attn_out=outputs, mlp_in=inputs, mlp_out=outputs)
        super().post_init()


class FivefoldModernBertModel(FivefoldModernBertPreTrainedModel, EncoderModel):
    output_class = BaseModelOutput


class FivefoldModernBertForMaskedLM(FivefoldModernBertPreTrainedModel, EncoderForMaskedLM):
    base_model_class = FivefoldModernBertModel


class FivefoldModernBertForSequenceClassification(FivefoldModernBertPreTrainedModel, EncoderForSequenceClassification):
    base_model_class = FivefoldModernBertModel


class FivefoldModernBertForTokenClassification(FivefoldModernBertPreTrainedModel, EncoderForTokenClassification):
    base_model_class = FivefoldModernBertModel


class FivefoldModernBertForQuestionAnswering(FivefoldModernBertPreTrainedModel, EncoderForQuestionAnswering):
    base_model_class = FivefoldModernBertModel


class FivefoldModernBertForMultipleChoice(FivefoldModernBertPreTrainedModel, EncoderForMultipleChoice):
    base_model_class = FivefoldModernBertModel
