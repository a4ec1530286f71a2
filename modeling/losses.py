"""Task losses with the stock semantics, normalised for gradient accumulation.

Without `num_items_in_batch` each loss is the stock mean. With it (Trainer passes it when the forward takes
**kwargs, and then does not divide by the accumulation steps itself) the summed loss is divided by the item
count of the whole accumulated batch, so 2 x 2 accumulation gives the same update as one batch of 4.
"""

import torch
from torch.nn import functional as F

from .input_checks import check_token_tensor
from .tracing import eager_only


def _reduce(per_item_sum: torch.Tensor, mean: torch.Tensor, num_items_in_batch) -> torch.Tensor:
    if num_items_in_batch is None:
        return mean
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(per_item_sum.device)
    return per_item_sum / num_items_in_batch


def tokens_shape(input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> tuple[int, ...]:
    """[B, T] (or [B, N, T]) of the inputs, to check labels against before any compute."""
    if input_ids is not None:
        check_token_tensor(input_ids, "input_ids", dims=(2, 3))  # before reading a list's or a float's shape
        return tuple(input_ids.shape)
    return tuple(inputs_embeds.shape[:-1]) if inputs_embeds is not None else ()


def batch_labels_shapes(
    input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, *widths: int
) -> tuple[tuple[int, ...], ...]:
    """[B], or [B, w] for each width w: what per-sequence labels may look like."""
    batch = tokens_shape(input_ids, inputs_embeds)[:1]
    return (batch, *((*batch, w) for w in widths))


def check_labels(name: str, labels: torch.Tensor | None, *shapes: tuple[int | None, ...], integer: bool = True) -> None:
    """Called before the forward pass: `labels` must have one of the shapes the head's loss reads (None: any
    size, e.g. the target length of a sequence-to-sequence model), and hold class ids (`integer`) unless the
    loss also reads scores (sequence classification's regression and multi-label targets)."""
    if labels is None:
        return
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"{name} must be a torch tensor, got a {type(labels).__name__}")
    if integer and (labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool):
        raise ValueError(f"{name} must hold integer class ids, got dtype {labels.dtype}")
    fits = any(
        labels.dim() == len(s) and all(w is None or w == n for w, n in zip(s, labels.shape, strict=True))
        for s in shapes
    )
    if not fits:
        want = " or ".join("[" + ", ".join("*" if w is None else str(w) for w in s) + "]" for s in shapes)
        raise ValueError(f"{name} has shape {list(labels.shape)}; these inputs need {want}")


@eager_only
def check_class_ids(labels: torch.Tensor, classes: int, ignore_index: int) -> None:
    """Out-of-range targets would fail inside the loss kernel (a device-side assert on GPU)."""
    if labels.dtype.is_floating_point or labels.numel() == 0:
        return
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= classes))
    if bool(bad.any()):
        examples = labels[bad][:5].tolist()
        raise ValueError(f"labels must be class ids in [0, {classes}) or {ignore_index} (ignored); got e.g. {examples}")


def cross_entropy(
    logits: torch.Tensor,  # [N, classes] (any leading shape, flattened here)
    labels: torch.Tensor,  # [N]
    num_items_in_batch=None,
    ignore_index: int = -100,
) -> torch.Tensor:
    classes = logits.shape[-1]
    if labels.numel() * classes != logits.numel():
        raise ValueError(
            f"labels of shape {list(labels.shape)} do not match predictions of shape {list(logits.shape[:-1])}"
        )
    logits = logits.reshape(-1, classes).float()
    labels = labels.reshape(-1).to(logits.device)
    check_class_ids(labels, classes, ignore_index)
    if num_items_in_batch is None:
        return F.cross_entropy(logits, labels, ignore_index=ignore_index)
    total = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    return _reduce(total, total, num_items_in_batch)


def sequence_classification_loss(logits: torch.Tensor, labels: torch.Tensor, config, num_items_in_batch=None):
    """Regression, single-label or multi-label, inferred into `config.problem_type` exactly as stock does."""
    num_labels = config.num_labels
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    labels = labels.to(logits.device)
    if config.problem_type in ("regression", "multi_label_classification") and labels.numel() != logits.numel():
        raise ValueError(f"{config.problem_type} needs labels of shape {list(logits.shape)}, got {list(labels.shape)}")
    if config.problem_type == "single_label_classification":
        return cross_entropy(logits.view(-1, num_labels), labels.view(-1), num_items_in_batch)
    if config.problem_type == "regression":
        pred, target = (logits.squeeze(), labels.squeeze()) if num_labels == 1 else (logits, labels)
        err = (pred.float() - target.float()).pow(2)
        return _reduce(err.sum(), err.mean(), num_items_in_batch)
    if config.problem_type == "multi_label_classification":
        err = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
        return _reduce(err.sum(), err.mean(), num_items_in_batch)
    raise ValueError(f"unknown problem_type {config.problem_type!r}")


def span_loss(
    start_logits: torch.Tensor,  # [B, T]
    end_logits: torch.Tensor,  # [B, T]
    start_positions: torch.Tensor,  # [B]
    end_positions: torch.Tensor,  # [B]
) -> torch.Tensor:
    """Extractive QA: positions past the sequence are ignored, as in stock."""
    ignored = start_logits.size(1)
    start = start_positions.reshape(-1).clamp(0, ignored).to(start_logits.device)
    end = end_positions.reshape(-1).clamp(0, ignored).to(end_logits.device)
    start_loss = cross_entropy(start_logits, start, ignore_index=ignored)
    end_loss = cross_entropy(end_logits, end, ignore_index=ignored)
    return (start_loss + end_loss) / 2
