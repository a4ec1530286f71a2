"""Public ViT checkpoints as stored on disk (`vit.` prefix on head models, none on `ViTModel`).

transformers 5 renames these tensors in memory (`layers.N.attention.q_proj`, ...); the files keep the names
below, and a key map reads the files."""

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
