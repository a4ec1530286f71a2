"""Which of dynamo's guards a model compiled with frozen weights needs.

Under `torch._inductor.config.freezing` the weights become constants of the graph, yet dynamo still checks every
module attribute and parameter before each call: 1.5 ms before each 11 ms decoding step of a SmolLM2-sized Llama
under int8 (the inside of torchao's weight subclasses is checked in Python). Torch's
`skip_guard_on_all_nn_modules_unsafe` drops those guards and, with them, what tells two models of one class apart:
their forwards share one code object, so the second model compiled in a process runs the first one's graph, its
frozen weights included, and answers with the first model's outputs. `frozen_weight_guards` keeps each parameter's
and buffer's identity and drops the rest.
"""


def frozen_weight_guards(entries: list) -> list[bool]:
    """A `guard_filter_fn` for `torch.compile(..., options={"guard_filter_fn": frozen_weight_guards})`: keeps every
    guard that is not on a module, and of the module guards the identity of each parameter and buffer. Module
    attributes (a config's flags among them) are then read once, when a graph is compiled: set them before."""
    return [
        not entry.orig_guard.source.is_unspecialized_nn_module()
        or (entry.guard_type == "ID_MATCH" and entry.name.endswith("]"))  # `..._parameters['weight']`, not `.qdata`
        for entry in entries
    ]
