"""What every fivefold config adds to the stock config it extends."""

import dataclasses

from .validation import check_rates_and_norms, check_sizes

# Fields of a config.json that would choose kernels to download and run: the caller's `from_pretrained(...,
# attn_implementation=...)` chooses them, never the checkpoint.
_CALLER_CHOOSES = ("attn_implementation", "experts_implementation")


class FivefoldConfigMixin:
    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        config_dict = {k: v for k, v in config_dict.items() if k not in _CALLER_CHOOSES}
        return super().from_dict(config_dict, **kwargs)

    def __post_init__(self, **kwargs) -> None:
        # A stock config.json carries its own model_type ("bert"); as an instance attribute it would shadow ours
        # and the config would be saved back as a stock one.
        kwargs.pop("model_type", None)
        # Before the stock config builds anything from its numbers (ModernBERT's per-layer list, the labels).
        fields = {f.name: getattr(self, f.name, None) for f in dataclasses.fields(self)}
        check_sizes({**fields, "num_labels": kwargs.get("num_labels")})
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_rates_and_norms(self)
