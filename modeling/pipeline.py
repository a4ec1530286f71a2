"""Pipeline parallelism (`DistributedConfig(pp_size=N)`) as transformers runs it, for fivefold's causal LMs.

transformers' splitter (`distributed/pipeline_parallel.py`) gives each rank an even share of `base_model.layers`,
puts identities in place of the final `norm` and of `lm_head` on all but the last stage, and feeds the stages after
the first the previous stage's hidden states as `inputs_embeds`. Its notion of embeddings is `embed_tokens`, a
word table alone; fivefold's `embeddings` module also adds positions, token types and dropout, which must not be
added to hidden states again. So on those stages the module is swapped for `StageInputs`, which keeps the tables
(under the same names: the checkpoint loads, a tied LM head finds its weight) and passes `inputs_embeds` through.
A stage's earlier layers never write the cache: the stack reads it at its `first_layer`.

Only a model that declares a plan (`_pp_plan` for its head, `base_model_pp_plan` in its config) is split; any other
is refused before anything is built on the ranks, since its outputs would be wrong rather than fail.
"""

import torch
from torch import nn


class StageInputs(nn.Module):
    """The embeddings on a pipeline stage after the first: the previous stage's hidden states, unchanged."""

    def __init__(self, embeddings: nn.Module):
        super().__init__()
        for name, child in embeddings.named_children():
            self.add_module(name, child)
        for name, parameter in embeddings.named_parameters(recurse=False):
            self.register_parameter(name, parameter)
        for name, buffer in embeddings.named_buffers(recurse=False):
            self.register_buffer(name, buffer)

    def check_inputs(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> None:
        if inputs_embeds is None:
            raise ValueError("a pipeline stage after the first takes the previous stage's hidden states")

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None) -> torch.Tensor:
        return inputs_embeds  # [B, T, C]


def check_pipeline_parallel(model: nn.Module) -> None:
    """Refuses, with the reason, a model transformers' splitter would get wrong."""
    if not (type(model)._pp_plan and model.config.base_model_pp_plan):
        raise ValueError(
            f"{type(model).__name__} does not support pipeline parallelism (pp_size > 1): fivefold splits the "
            "causal LMs of decoders that declare a pipeline plan (`_pp_plan`, `base_model_pp_plan`)"
        )


def adapt_stage(model: nn.Module) -> None:
    """After transformers' split: stages after the first read hidden states, not tokens."""
    stage = model._pp_stage
    base = getattr(model, model.base_model_prefix)
    base.first_layer = stage.layer_range_for_rank(stage.pp_rank, len(base.layers))[0]
    if not stage.pp_is_first_stage:
        base.embeddings = StageInputs(base.embeddings)
