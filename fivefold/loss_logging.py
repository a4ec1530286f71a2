"""`Trainer`s that log the parts of a loss beside their sum.

`ForPreTraining` returns one loss, masked LM + next-sentence prediction, as stock BERT does; a mixture-of-experts
model adds its router's load-balancing loss (scaled by `router_aux_loss_coef`) to the LM loss. These trainers train
on that sum and also read the parts off the same forward, so that every logging step reports them beside `loss`
(each averaged over the training batches since the last log), in `trainer.state.log_history` and every report
integration:

    PreTrainingTrainer        mlm_loss, nsp_loss   (BERT's ForPreTraining)
    MixtureOfExpertsTrainer   aux_loss             (Mixtral, with output_router_logits=True)

Shapes: B batch, T time, V vocabulary.
"""

import torch
from torch.nn import functional as F
from transformers import Trainer


class LossPartsTrainer(Trainer):
    """A `Trainer` whose logs add the numbers `loss_parts` reads off each training forward."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parts: dict[str, list[float]] = {}

    def loss_parts(self, outputs, inputs: dict) -> dict[str, float]:
        raise NotImplementedError

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training:
            with torch.no_grad():
                for name, value in self.loss_parts(outputs, inputs).items():
                    self._parts.setdefault(name, []).append(value)
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            logs.update({name: round(sum(v) / len(v), 4) for name, v in self._parts.items() if v})
            self._parts = {}
        super().log(logs, *args, **kwargs)


class PreTrainingTrainer(LossPartsTrainer):
    """Logs `mlm_loss` and `nsp_loss` (for `ForPreTraining` models)."""

    def loss_parts(self, outputs, inputs: dict) -> dict[str, float]:
        parts = {}
        if inputs.get("labels") is not None:
            logits = outputs.prediction_logits  # [B, T, V]
            parts["mlm_loss"] = F.cross_entropy(logits.flatten(0, 1).float(), inputs["labels"].flatten()).item()
        if inputs.get("next_sentence_label") is not None:
            logits = outputs.seq_relationship_logits  # [B, 2]
            parts["nsp_loss"] = F.cross_entropy(logits.float(), inputs["next_sentence_label"].flatten()).item()
        return parts


class MixtureOfExpertsTrainer(LossPartsTrainer):
    """Logs the router's load-balancing `aux_loss` (before `router_aux_loss_coef`; top k when perfectly balanced)."""

    def loss_parts(self, outputs, inputs: dict) -> dict[str, float]:
        aux = getattr(outputs, "aux_loss", None)
        return {} if aux is None else {"aux_loss": float(aux)}
