"""What of a checkpoint's config.json reaches the config fivefold builds and writes: the fields the config class
knows, less those that would make a later load select code, kernels, quantisation or classes from elsewhere, and
fields it does not know only where their value is plain data (numbers, booleans, null: the legacy spellings stock
configs still read, such as ModernBERT's `global_attn_every_n_layers` or T5's `decoder_start_token_id`); an
unknown string or object could name a class, a repo or a file, and is dropped.
The attention implementation is the caller's choice (`attn_implementation=` in `from_pretrained`), never the
checkpoint's."""

import functools

# Fields a config.json may carry that choose what runs rather than what is computed (docs/errors.md says why).
SELECTS_CODE = (
    "attn_implementation",  # a Hub kernel repo ("kernels-community/x") is downloaded and imported by name
    "_attn_implementation",  # the same, under the name configs keep it (the config's constructor applies it)
    "experts_implementation",  # the same, for mixture-of-experts kernels
    "_experts_implementation",
    "auto_map",  # classes in shipped code or in another Hub repo, run with trust_remote_code=True
    "custom_pipelines",  # pipeline classes in shipped code
    "trust_remote_code",  # a load option, not a property of the model
    "quantization_config",  # makes from_pretrained quantise (and import the quantiser) on load
    "tokenizer_class",  # the tokenizer class AutoTokenizer builds when the tokenizer's own config is silent
    "processor_class",  # the same for processors
)
# Known to stock configs of v4, plain data: pipelines read their prompts and generation defaults (text-generation
# puts `prefix` before every prompt), a fine-tuned checkpoint names its task, and `rope_scaling` is how the Hub's
# checkpoints spell their rope (Llama 3.1 and 3.2, gpt-oss, Qwen2.5's yarn), which the config class reads into
# `rope_parameters`.
_DATA_FIELDS = ("task_specific_params", "prefix", "finetuning_task", "rope_scaling")
# Bookkeeping that fivefold writes itself.
_REWRITTEN = ("transformers_version", "architectures", "model_type", "_name_or_path")


@functools.cache
def known_fields(config_class: type) -> frozenset[str]:
    """The fields the config class has: its dataclass fields and whatever its default instance serialises."""
    return frozenset(config_class.__dataclass_fields__) | frozenset(config_class().to_dict())


def kept_fields(config_class: type, fields: dict) -> dict:
    """The fields of a config.json that are carried over: known to `config_class`, none that selects code."""
    known = known_fields(config_class)
    return {
        k: v
        for k, v in fields.items()
        if k not in SELECTS_CODE and k not in _REWRITTEN and (k in known or k in _DATA_FIELDS or _plain_data(v))
    }


def _plain_data(value: object) -> bool:
    if isinstance(value, list):
        return all(_plain_data(v) for v in value)
    return value is None or isinstance(value, bool | int | float)


def without_code_selectors(fields: dict) -> dict:
    """A config.json's fields less those that select code: what `verify` builds stock's model from, so that a field
    the conversion drops (an unknown one among them) shows as a difference rather than being dropped on both sides."""
    return {k: v for k, v in fields.items() if k not in SELECTS_CODE}
