"""The table of architectures: a list of names. Each name is a key-map module, `fivefold.conversion.<name>`, whose
`ARCHITECTURE` row holds everything else (config, model classes, key map, tiny and public configs, sample inputs).

Adding an architecture: its config, recipe and key-map files, and its name here (docs/adding-an-architecture.md).
"""

import importlib

import transformers
from transformers.models.auto import tokenization_auto

from fivefold.conversion.architecture import Architecture, stock_class_name

__all__ = [
    "ARCHITECTURES",
    "NAMES",
    "Architecture",
    "architecture_for_config",
    "architecture_for_model_type",
    "load",
    "register",
    "stock_class_name",
]

NAMES = (
    "bert", "roberta", "modernbert", "vit", "gpt2", "mixtral", "t5",
    "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss",
)  # fmt: skip


def load(module: str) -> Architecture:
    """The row declared by a key-map module."""
    return importlib.import_module(module).ARCHITECTURE


ARCHITECTURES: tuple[Architecture, ...] = tuple(load(f"fivefold.conversion.{name}") for name in NAMES)


def register(arch: Architecture) -> None:
    """Makes transformers' Auto classes resolve the architecture's model type to its config and classes, and
    names the classes in the tables of class names behind them (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, ...), which
    transformers also reads by name: the Trainer shifts labels for label smoothing only for a class named in the
    causal-LM table, and `transformers serve` generates only with those."""
    transformers.AutoConfig.register(arch.model_type, arch.config_class, exist_ok=True)
    for auto_name, model_class in arch.auto_classes.items():
        getattr(transformers, auto_name).register(arch.config_class, model_class, exist_ok=True)
    for auto_name, model_class in arch.models.items():  # not a pipeline's fallback: T5 is no causal LM to Trainer
        names = getattr(getattr(transformers, auto_name)._model_mapping, "_model_mapping", None)
        if isinstance(names, dict):
            names.setdefault(arch.model_type, model_class.__name__)
    _tokenizers_as_for_stock(arch)


def _tokenizers_as_for_stock(arch: Architecture) -> None:
    """AutoTokenizer reads the fivefold model type as the stock one. It picks a tokenizer class by the config's
    model type where `tokenizer_config.json` names none (bert-base-uncased, gpt2 and roberta-base ship so: a
    fivefold folder otherwise got a bare tokenizer, without a mask or padding token), and it overrides the class the
    file names for some types (Qwen2, ModernBERT)."""
    names = tokenization_auto.TOKENIZER_MAPPING_NAMES
    if arch.stock_model_type in names:
        names.setdefault(arch.model_type, names[arch.stock_model_type])
        # The mapping from config classes finds a class's model type by the class's name, and imports the tokenizer
        # from that type's module: the stock one.
        by_config_name = getattr(tokenization_auto.TOKENIZER_MAPPING, "_reverse_config_mapping", None)
        if isinstance(by_config_name, dict):
            by_config_name.setdefault(arch.config_class.__name__, arch.stock_model_type)
    if arch.stock_model_type in tokenization_auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS:
        tokenization_auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS.add(arch.model_type)


def architecture_for_config(config_class: type) -> Architecture:
    for arch in ARCHITECTURES:
        if arch.config_class.__name__ == config_class.__name__:
            return arch
    raise KeyError(f"{config_class.__name__} is not a fivefold config")


def architecture_for_model_type(model_type: str | None) -> Architecture:
    """By stock (`bert`) or fivefold (`fivefold_bert`) model_type."""
    for arch in ARCHITECTURES:
        if model_type in (arch.stock_model_type, arch.model_type):
            return arch
    valid = ", ".join(a.stock_model_type for a in ARCHITECTURES)
    raise KeyError(f"unsupported model_type {model_type!r}; fivefold converts: {valid}")
