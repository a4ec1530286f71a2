"""Data-parallel training never hangs on a mixture of experts: DDP with `find_unused_parameters=False`, with
`static_graph=True` and with gradient checkpointing, while experts get no token on one rank (every expert takes
part in every backward pass, with a zero gradient when idle). Two gloo processes the test starts itself.

Checkpointing is transformers' default, non-reentrant: reentrant checkpointing records the router logits under
no_grad, so the load-balancing loss gets no gradient there, in stock Mixtral as in fivefold (measured: 5e-3 apart)."""

import pytest
from launching import launch

# Gloo processes that each import torch and transformers: an integration test, out of the quick check.
pytestmark = pytest.mark.slow

MODES = [
    {"name": "strict", "ddp": {"find_unused_parameters": False}, "checkpointing": None},
    {"name": "static_graph", "ddp": {"static_graph": True}, "checkpointing": None},
    {"name": "checkpointing", "ddp": {"find_unused_parameters": False}, "checkpointing": {"use_reentrant": False}},
    {"name": "checkpointing_static", "ddp": {"static_graph": True}, "checkpointing": {"use_reentrant": False}},
]


def test_ddp_with_idle_experts_equals_one_process(tmp_path):
    results = launch("ddp", 2, tmp_path, {"modes": MODES}, timeout=600)
    assert results[1]["idle_on_rank_1"] >= 4  # two tokens, top-1, 4 experts, 2 layers: at least 2 idle per layer
    for result in results:
        for mode in MODES:
            assert result[mode["name"]]["vs_rank_0"] == 0.0, mode
            assert result[mode["name"]]["vs_one_process"] <= 1e-5, (mode, result[mode["name"]])
