"""fivefold: the five Transformer families from one block, as a plugin for Hugging Face transformers.

Importing fivefold registers every fivefold config and model with transformers' Auto classes, and exports them:
`fivefold.FivefoldBertConfig`, `fivefold.FivefoldBertForMaskedLM`, ... (the architecture table lists them once).
"""

from fivefold import conversion, peft_defaults, sentence_encoders
from fivefold.architectures import ARCHITECTURES, register
from fivefold.compiling import frozen_weight_guards
from fivefold.conversion import CheckpointWarning, ConversionError, convert, export, push_folder, verify
from fivefold.masked_lm import MLM_PROBABILITY, PackedMaskedLMCollator, masked_lm_collator
from fivefold.modeling.pretrained import FivefoldPreTrainedModel
from fivefold.next_sentence import next_sentence_pairs
from fivefold.span_corruption import DataCollatorForSpanCorruption

__version__ = "0.1.0"

# Models convert stock checkpoints and ship their code through the converter; modeling code never imports it
# (the converter imports the models), and code shipped inside a checkpoint runs without it.
FivefoldPreTrainedModel.converter = conversion

_classes = {}
for _arch in ARCHITECTURES:
    register(_arch)
    for _cls in (_arch.config_class, _arch.pretrained_class, *_arch.models.values()):
        _classes[_cls.__name__] = _cls
globals().update(_classes)
peft_defaults.register()  # LoRA's default targets for fivefold's model types, once PEFT is imported
sentence_encoders.register()  # a converted T5's encoder for sentence-transformers, once it is imported

# The Trainer subclasses import transformers' Trainer (and `datasets` with it), a second of every start-up that
# converting, loading and the command line never need: imported on first use.
_LAZY = {
    "MixtureOfExpertsTrainer": "fivefold.loss_logging",
    "PreTrainingTrainer": "fivefold.loss_logging",
    "last_complete_checkpoint": "fivefold.resume",
    "last_training_state": "fivefold.training_state",
    "load_training_state": "fivefold.training_state",
    "save_training_state": "fivefold.training_state",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fivefold' has no attribute {name!r}")


__all__ = [
    "CheckpointWarning",
    "ConversionError",
    "MLM_PROBABILITY",
    "MixtureOfExpertsTrainer",
    "DataCollatorForSpanCorruption",
    "PackedMaskedLMCollator",
    "PreTrainingTrainer",
    "__version__",
    "convert",
    "export",
    "frozen_weight_guards",
    "last_complete_checkpoint",
    "last_training_state",
    "load_training_state",
    "masked_lm_collator",
    "next_sentence_pairs",
    "push_folder",
    "save_training_state",
    "verify",
    *sorted(_classes),
]
