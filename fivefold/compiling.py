"""Which of dynamo's guards a model compiled with frozen weights needs.

Under `torch._inductor.config.freezing` the weights become constants of the graph, yet dynamo still checks every
module attribute and parameter before each call: 1.5 ms before each 11 ms decoding step of a SmolLM2-sized Llama
under int8 (the inside of torchao's weight subclasses is checked in Python). Torch's
`skip_guard_on_all_nn_modules_unsafe` drops those guards and, with them, what tells two models of one class apart:
their forwards share one code object, so the second model compiled in a process runs the first one's graph, its
frozen weights included, and answers with the first model's outputs. `frozen_weight_guards` keeps the identity of
each parameter, buffer and other tensor a module holds, and drops the rest.
"""

import torch


def frozen_weight_guards(entries: list) -> list[bool]:
    """A `guard_filter_fn` for `torch.compile(..., options={"guard_filter_fn": frozen_weight_guards})`: keeps every
    guard that is not on a module; of the module guards, the identity of each tensor a graph may hold as a constant
    and the values of plain attributes (`layer_idx`, a flag). Where a module's forward is a frame of its own (a
    graph break inside a layer: bitsandbytes' int8 linears have one), its instances share that code, and those
    values are what tell them apart: without them every attention would write the first one's cache layer. What
    is dropped is the walk through module dicts, hooks and types, which a model's one frame repeats per module."""
    return [
        not entry.orig_guard.source.is_unspecialized_nn_module()
        or entry.guard_type in ("CONSTANT_MATCH", "EQUALS_MATCH")
        or _tensor_identity(entry)
        for entry in entries
    ]


def _tensor_identity(entry) -> bool:
    """Each parameter and buffer (`..._parameters['weight']`), and any other tensor a module holds as an attribute
    (bitsandbytes' `state.CB`, which a layer's own frame bakes in: without its guard every layer would run the
    first one's int8 weight); not the tensors inside a parameter (torchao's `.qdata`), which its identity covers."""
    if entry.guard_type != "ID_MATCH":
        return False
    if entry.name.endswith("]"):
        return True
    return isinstance(getattr(entry, "value", None), torch.Tensor) and "._parameters[" not in entry.name
