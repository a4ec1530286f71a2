"""What every task model shares: a backbone under `model` and the heads of its tasks, built from the recipe.

A task model names its tasks and their output sizes (`tasks = {"masked_lm": "vocab_size"}`); the recipe holds a
`HeadSpec` per task, whose `at` says where the head's projection lives in the checkpoint layout (heads.py). The
model gets exactly those modules, ignores the tensors of the architecture's other heads on load, and runs a
task's head on tensors with `run_head`.

Shapes: B batch, T time, C channels, O head outputs.
"""

import re
from collections.abc import Mapping

import torch
from torch import nn
from transformers.modeling_outputs import QuestionAnsweringModelOutput

from .heads import Head, HeadSpec, projection
from .losses import span_loss
from .pretrained import FivefoldPreTrainedModel


def beside_name(spec: HeadSpec) -> str:
    """The attribute of a head whose projection sits beside it: `head` where it holds weights (ModernBERT's
    `head.dense`, as the checkpoint names them), else `pool`. Not `head` then: transformers and accelerate find a
    tied weight's module by substring when they place modules (`device_map="auto"`), and `head` is in `lm_head`."""
    return "head" if spec.transform is not None else "pool"


def stock_name_of_the_base() -> property:
    """The base model of a head model under the name stock's class gives it where that is not `model` (BERT's
    `model.bert`, GPT-2's `model.transformer`, ...): the same module, read-only, for code written against stock
    (`for p in model.bert.parameters(): p.requires_grad_(False)`). A base model has none, as in stock."""
    return property(lambda self: self.model, doc="The base model, as stock's class names it (`base_model`).")


class TaskModel(FivefoldPreTrainedModel):
    # Task -> its number of outputs: a config field ("num_labels") or a number.
    tasks: Mapping[str, str | int] = {}
    output_task: str | None = None  # the task whose projection is the output embedding, tied to the input's
    input_embeddings_key = "model.embeddings.word_embeddings.weight"

    def add_heads(self, config, heads: Mapping[str, HeadSpec], width: int) -> None:
        self.head_specs = {task: heads[task] for task in self.tasks}
        for task, size in self.tasks.items():
            spec, size = heads[task], getattr(config, size) if isinstance(size, str) else size
            if spec.projection:
                self.add_module(spec.owner, Head(spec, width, size))
            else:  # the head pools and transforms; the task model projects
                if hasattr(self, "head") or hasattr(self, "pool"):
                    raise ValueError(f"{type(self).__name__}: two heads beside their projections")
                self.add_module(beside_name(spec), Head(spec, width))
                self.add_module(spec.owner, projection(spec, width, size) if size else nn.Identity())
        if self.output_task is not None:
            tied = {f"{heads[self.output_task].at}.weight": self.input_embeddings_key}
            self._tied_weights_keys = {**(self._tied_weights_keys or {}), **tied}
        own = {name for name, _ in self.named_children()}
        others = {spec.owner for spec in heads.values()} | {"head"}
        ignored = [rf"^{re.escape(name)}\." for name in sorted(others - own)]
        self._keys_to_ignore_on_load_unexpected = [*(self._keys_to_ignore_on_load_unexpected or []), *ignored]

    def run_head(
        self,
        task: str,
        hidden: torch.Tensor,  # [B, T, C], or [N, C]
        mask: torch.Tensor | None = None,  # [B, T]: the real tokens, for pools that need them
        pooled: torch.Tensor | None = None,  # [B, C]: the backbone's pooler output
    ) -> torch.Tensor:  # [B, (T,) O]
        spec = self.head_specs[task]
        owner = getattr(self, spec.owner)
        if spec.projection:  # by the spec, not the module's type: PEFT wraps the heads it trains (modules_to_save)
            return owner(hidden, mask, pooled)
        return owner(getattr(self, beside_name(spec))(hidden, mask, pooled))

    def answer_spans(self, out, start_positions, end_positions) -> QuestionAnsweringModelOutput:
        """Extractive QA on the backbone's output `out`: start and end logits per token, the span loss where both
        positions ([B] each) are given."""
        logits = self.run_head("question_answering", out.last_hidden_state)  # [B, T, 2]
        start_logits, end_logits = (x.squeeze(-1).contiguous() for x in logits.split(1, dim=-1))  # 2 x [B, T]
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module | None:
        return None if self.output_task is None else self.get_submodule(self.head_specs[self.output_task].at)

    def set_output_embeddings(self, value: nn.Module) -> None:
        if self.output_task is None:
            raise AttributeError(f"{type(self).__name__} has no output embeddings")
        parent, _, name = self.head_specs[self.output_task].at.rpartition(".")
        setattr(self.get_submodule(parent) if parent else self, name, value)
