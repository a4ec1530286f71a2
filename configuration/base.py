"""What every fivefold config adds to the stock config it extends."""


class FivefoldConfigMixin:
    def __post_init__(self, **kwargs) -> None:
        # A stock config.json carries its own model_type ("bert"); as an instance attribute it would shadow ours
        # and the config would be saved back as a stock one.
        kwargs.pop("model_type", None)
        super().__post_init__(**kwargs)
