"""PEFT's default LoRA targets for fivefold's model types, as PEFT has them for the stock types.

PEFT keeps its defaults in a public table, `peft.utils.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`
(model_type -> module names), which `get_peft_model` reads when a `LoraConfig` names no `target_modules`. Importing
PEFT takes seconds, so `import fivefold` does not: it adds its rows to that table when PEFT is there, at once if
PEFT is already imported, else right after PEFT defines the table.

Beyond the defaults, `target_modules` reaches every linear layer by name: `q_proj`, `k_proj`, `v_proj`, `o_proj`,
`up_proj`, `gate_proj`, `down_proj`, and Mixtral's `router`; one expert's layers by a regex such as
`r".*experts\\.3\\.(gate_proj|up_proj|down_proj)"` (docs/fine-tune.md).
"""

from .after_import import when_imported

_TABLE_MODULE = "peft.utils.constants"
_TABLE = "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"


def lora_target_modules() -> dict[str, list[str]]:
    from fivefold.architectures import ARCHITECTURES

    return {arch.model_type: list(arch.lora_targets) for arch in ARCHITECTURES}


def add_rows(module) -> None:
    """fivefold's rows in the table of PEFT's constants module (one being imported, maybe not yet complete)."""
    table = getattr(module, _TABLE, None)
    if isinstance(table, dict):
        for model_type, targets in lora_target_modules().items():
            table.setdefault(model_type, targets)


def register() -> None:
    """Adds fivefold's rows to PEFT's table now (PEFT imported) or when PEFT is imported."""
    when_imported(_TABLE_MODULE, add_rows)
