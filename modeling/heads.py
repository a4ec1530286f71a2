"""The task-head layer every model shares: pool -> transform -> dropout -> projection, on tensors.

A head pools the backbone's states (by name, from `POOLS`), optionally transforms them (dense -> activation ->
norm), drops out and projects. Its modules are named as the checkpoint layout has them: the transform's `dense`
and `norm` are the head's own children, and `HeadSpec.at` says where the projection lives, either inside the head
(`lm_head.decoder`: the head is the task model's `lm_head`, its projection `decoder`) or beside it in the task
model (`classifier`: the head is the task model's `head`, the task model projects what it returns; tasks.py).
A pooler is a head without a projection (`at=""`).

Shapes: B batch, T time, C channels, O head outputs (labels, vocabulary).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .feedforward import activation
from .initialization import WeightInit, with_init
from .linear import Linear
from .norms import build_norm


def every_token(hidden: torch.Tensor, mask: torch.Tensor | None, pooled: torch.Tensor | None) -> torch.Tensor:
    return hidden  # [B, T, C]


def pooler_output(hidden: torch.Tensor, mask: torch.Tensor | None, pooled: torch.Tensor | None) -> torch.Tensor:
    if pooled is None:
        raise ValueError("this head reads the pooler output, and the backbone was built without a pooler")
    return pooled  # [B, C]


def first_token(hidden: torch.Tensor, mask: torch.Tensor | None, pooled: torch.Tensor | None) -> torch.Tensor:
    return hidden[:, 0]  # [B, C]: the [CLS] position


def first_real_token(hidden: torch.Tensor, mask: torch.Tensor | None, pooled: torch.Tensor | None) -> torch.Tensor:
    """The first non-padding token of each row, so that left padding is allowed."""
    if mask is None:
        return hidden[:, 0]
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), mask.argmax(dim=-1)]


def mean_of_tokens(hidden: torch.Tensor, mask: torch.Tensor | None, pooled: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return hidden.mean(dim=1)
    weights = mask.to(hidden.dtype).unsqueeze(-1)  # [B, T, 1]
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


def last_real_token(hidden: torch.Tensor, mask: torch.Tensor | None, pooled: torch.Tensor | None) -> torch.Tensor:
    """The rightmost non-padding token of each row (left or right padding); the last position without a mask."""
    if mask is None:
        return hidden[:, -1]
    steps = torch.arange(mask.shape[-1], device=mask.device, dtype=torch.int32)
    last = (steps * mask.int()).argmax(-1)  # [B]
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last.to(hidden.device)]


POOLS: dict[str, Callable[..., torch.Tensor]] = {
    "none": every_token,
    "pooler": pooler_output,
    "first": first_token,
    "first_real": first_real_token,
    "mean": mean_of_tokens,
    "last_real": last_real_token,
}


@dataclass(frozen=True)
class TransformSpec:
    """dense -> activation -> norm, before a head's projection (or as the whole of a pooler)."""

    activation: str  # key in transformers' ACT2FN
    norm: str = "none"  # key in NORMS
    norm_eps: float = 1e-12
    bias: bool = True
    out_size: int | None = None  # None: the model width


@dataclass(frozen=True)
class HeadSpec:
    pool: str = "none"  # key in POOLS
    transform: TransformSpec | None = None
    dropout: float = 0.0  # after the transform, before the projection
    input_dropout: float = 0.0  # before the transform (RoBERTa's classifier drops out twice)
    at: str = ""  # where the projection lives: "lm_head.decoder" (inside), "classifier" (beside), "" (none)
    bias: bool = True  # on the projection
    transform_init: WeightInit | None = None  # the transform's dense; None: initializer_range
    projection_init: WeightInit | None = None

    @property
    def owner(self) -> str:
        """The task model's attribute holding the projection: the head itself (`lm_head` of `lm_head.decoder`),
        or the projection where it sits beside the head (`classifier`)."""
        return self.at.partition(".")[0]

    @property
    def projection(self) -> str:
        """The projection's name inside the head (`decoder` of `lm_head.decoder`); "" where it has none."""
        return self.at.partition(".")[2]

    def __post_init__(self) -> None:
        if self.pool not in POOLS:
            raise ValueError(f"unknown pool {self.pool!r}; valid: {', '.join(sorted(POOLS))}")


def token_classifier_dropout(config) -> float:
    """The dropout before a decoder's token classifier, as stock picks it: `classifier_dropout`, else
    `hidden_dropout`, else 0.1."""
    chosen = (getattr(config, "classifier_dropout", None), getattr(config, "hidden_dropout", None))
    return next((p for p in chosen if p is not None), 0.1)


def projection(spec: HeadSpec, width: int, out_features: int) -> nn.Module:
    return with_init(Linear(width, out_features, bias=spec.bias), spec.projection_init)


class Head(nn.Module):
    """The head of a spec. `out_features` sizes the projection when it lives inside the head."""

    def __init__(self, spec: HeadSpec, hidden_size: int, out_features: int | None = None):
        super().__init__()
        self.spec = spec
        self.pool = POOLS[spec.pool]
        self.input_dropout = nn.Dropout(spec.input_dropout)
        t = spec.transform
        width = hidden_size if t is None or t.out_size is None else t.out_size
        self.dense = with_init(Linear(hidden_size, width, bias=t.bias), spec.transform_init) if t else nn.Identity()
        self.act = activation(t.activation) if t is not None else nn.Identity()
        self.norm = build_norm(t.norm, width, t.norm_eps) if t is not None else nn.Identity()
        self.dropout = nn.Dropout(spec.dropout)
        if spec.projection:
            self.add_module(spec.projection, projection(spec, width, out_features))

    def forward(
        self,
        hidden: torch.Tensor,  # [B, T, C]
        mask: torch.Tensor | None = None,  # [B, T], 1 = token: what the pool counts as real
        pooled: torch.Tensor | None = None,  # [B, C], the backbone's pooler output
    ) -> torch.Tensor:  # [B, (T,) O] with a projection inside, else [B, (T,) C]
        x = self.pool(hidden, mask, pooled)
        x = self.dropout(self.norm(self.act(self.dense(self.input_dropout(x)))))
        return getattr(self, self.spec.projection)(x) if self.spec.projection else x
