"""`Trainer` for BERT's two pre-training objectives that logs each loss beside their sum.

`ForPreTraining` returns one loss, masked LM + next-sentence prediction, as stock BERT does. `PreTrainingTrainer`
trains on that sum and also reads the two parts off the same forward (the prediction logits and the
next-sentence logits), so that every logging step reports `loss`, `mlm_loss` and `nsp_loss` (the parts averaged
over the training batches since the last log), in `trainer.state.log_history` and every report integration.

Shapes: B batch, T time, V vocabulary.
"""

import torch
from torch.nn import functional as F
from transformers import Trainer


def loss_parts(outputs, inputs: dict) -> dict[str, float]:
    """The masked-LM and next-sentence losses of one forward, as plain numbers."""
    parts = {}
    with torch.no_grad():
        if inputs.get("labels") is not None:
            logits = outputs.prediction_logits  # [B, T, V]
            parts["mlm_loss"] = F.cross_entropy(logits.flatten(0, 1).float(), inputs["labels"].flatten()).item()
        if inputs.get("next_sentence_label") is not None:
            logits = outputs.seq_relationship_logits  # [B, 2]
            parts["nsp_loss"] = F.cross_entropy(logits.float(), inputs["next_sentence_label"].flatten()).item()
    return parts


class PreTrainingTrainer(Trainer):
    """A `Trainer` whose logs add `mlm_loss` and `nsp_loss` (for `ForPreTraining` models)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parts: dict[str, list[float]] = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training:
            for name, value in loss_parts(outputs, inputs).items():
                self._parts.setdefault(name, []).append(value)
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            logs.update({name: round(sum(v) / len(v), 4) for name, v in self._parts.items() if v})
            self._parts = {}
        super().log(logs, *args, **kwargs)
