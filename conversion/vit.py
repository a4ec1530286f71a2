"""Public ViT checkpoints as stored on disk (`vit.` prefix on head models, none on `ViTModel`).

transformers 5 renames these tensors in memory (`layers.N.attention.q_proj`, ...); the files keep the names
below, and a key map reads the files."""

from fivefold.configuration.vit import FivefoldViTConfig
from fivefold.modeling import vit as modeling

from .architecture import Architecture
from .inputs import image_sample
from .keymap import KeyMap, legacy_norm_names, renames

VIT_BASE = {
    "embeddings.cls_token": "embeddings.cls_token",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.patch_embeddings.projection": "embeddings.patch_proj",
    "encoder.layer.{}.layernorm_before": "layers.{}.norm_before_attn",
    "encoder.layer.{}.attention.attention.query": "layers.{}.attn.q_proj",
    "encoder.layer.{}.attention.attention.key": "layers.{}.attn.k_proj",
    "encoder.layer.{}.attention.attention.value": "layers.{}.attn.v_proj",
    "encoder.layer.{}.attention.output.dense": "layers.{}.attn.o_proj",
    "encoder.layer.{}.layernorm_after": "layers.{}.norm_before_mlp",
    "encoder.layer.{}.intermediate.dense": "layers.{}.mlp.up_proj",
    "encoder.layer.{}.output.dense": "layers.{}.mlp.down_proj",
    "layernorm": "norm",
    "pooler.dense": "pooler.dense",
}

VIT_HEADS = {"classifier": "classifier"}

VIT_KEYS = KeyMap(renames(VIT_BASE), renames(VIT_HEADS), legacy=legacy_norm_names)

# 32 x 32 images in 8 x 8 patches: 16 patch tokens and [CLS].
TINY_VIT = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=32, patch_size=8,
    num_channels=3,
)  # fmt: skip

# google/vit-base-patch16-224's config.json: the fields that set its shapes.
VIT_BASE_PATCH16_224 = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    image_size=224,
    patch_size=16,
    num_channels=3,
    qkv_bias=True,
    layer_norm_eps=1e-12,
    num_labels=1000,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="vit",
    stock_prefix="vit",
    config_class=FivefoldViTConfig,
    models={
        "AutoModel": modeling.FivefoldViTModel,
        "AutoModelForImageClassification": modeling.FivefoldViTForImageClassification,
    },
    keys=lambda config: VIT_KEYS,
    tiny=TINY_VIT,
    public={"google/vit-base-patch16-224": VIT_BASE_PATCH16_224},
    sample_inputs=image_sample,
)
