"""What fivefold knows of one architecture: the row its key-map file declares (`ARCHITECTURE`) and the table in
`fivefold.architectures` lists by name. A leaf module: it imports nothing of fivefold but the key-map type."""

from collections.abc import Callable
from dataclasses import dataclass, field

from transformers import PretrainedConfig, PreTrainedModel

from .keymap import KeyMap


@dataclass(frozen=True)
class Architecture:
    stock_model_type: str  # model_type of the public checkpoints
    stock_prefix: str  # base_model_prefix of the stock head classes ("" where the public files have none)
    config_class: type[PretrainedConfig]
    models: dict[str, type[PreTrainedModel]]  # transformers Auto class name -> our class
    keys: Callable[[PretrainedConfig], KeyMap]  # the key map for a config of this architecture
    # A tiny stock config for the demo and tests (vocab 99, hidden 32, 2 layers, intermediate 37).
    tiny: dict
    # Hub id -> the fields of that public checkpoint's config.json that set its shapes (meta tests, benchmarks).
    public: dict[str, dict]
    # (stock config, stock class name, seed) -> a batch for that class, used by `verify`, `demo` and tests.
    sample_inputs: Callable[..., dict]
    # PEFT's default LoRA targets for this model type (`LoraConfig` without target_modules), after PEFT's own for
    # the stock type: the query and value projections, or all three where stock fuses them into one layer.
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    # Auto class -> the Auto class in `models` whose class it also loads. A stock pipeline whose Auto class does
    # not take the config falls back on the class `config.architectures` names inside transformers, which holds
    # no fivefold class: T5 in "text-generation" reaches its conditional-generation class this way instead.
    pipeline_fallbacks: dict[str, str] = field(default_factory=dict)
    # The `quant_method`s of stock checkpoints whose stored tensors the key map dequantizes (gpt-oss: "mxfp4"); a
    # checkpoint quantized any other way is refused.
    quantized_layouts: tuple[str, ...] = ()
    # Stock class name -> its base_model_prefix, where it differs from `stock_prefix` (LlamaForQuestionAnswering
    # keeps its base under `transformer.`, the other Llama classes under `model.`).
    stock_prefixes: dict[str, str] = field(default_factory=dict)

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def auto_classes(self) -> dict[str, type[PreTrainedModel]]:
        """Every Auto class registered (and written into `auto_map`) for this architecture -> our class."""
        fallbacks = {auto: self.models[target] for auto, target in self.pipeline_fallbacks.items()}
        return {**self.models, **fallbacks}

    @property
    def base_model(self) -> type[PreTrainedModel]:
        return self.models["AutoModel"]

    @property
    def pretrained_class(self) -> type[PreTrainedModel]:
        """The architecture's common base (`FivefoldBertPreTrainedModel`), as stock has `BertPreTrainedModel`."""
        return self.base_model.__bases__[0]

    def stock_prefix_of(self, target: type[PreTrainedModel]) -> str:
        """The prefix of the base-model tensors in files saved by the stock class matching our `target`."""
        return self.stock_prefixes.get(stock_class_name(target), self.stock_prefix)

    def class_named(self, name: str) -> type[PreTrainedModel]:
        """Our class for a stock class name (`BertForMaskedLM`) or one of ours (`FivefoldBertForMaskedLM`)."""
        for cls in self.models.values():
            if name in (cls.__name__, stock_class_name(cls)):
                return cls
        valid = ", ".join(stock_class_name(c) for c in self.models.values())
        raise KeyError(f"{name!r} is not supported for {self.stock_model_type}; supported: {valid}")


def stock_class_name(cls: type) -> str:
    return cls.__name__.removeprefix("Fivefold")
