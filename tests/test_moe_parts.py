"""The mixture-of-experts parts beyond Mixtral's, each against stock's sparse block on the same weights: the
routing without renormalisation and with weights in the activations' dtype (Qwen2-MoE, Qwen3-MoE, OLMoE), the
shared expert with its sigmoid gate (Qwen2-MoE), the registries' errors, and the gradients of every expert."""

import pytest
import torch
from transformers import OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig
from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from fivefold.conversion.experts import copy_stock_moe_block
from fivefold.modeling.moe import MixtureOfExperts, MoESpec, NoSharedExpert, SharedExpert
from fivefold.modeling.routers import ROUTINGS

C, F, S, E, K = 16, 32, 48, 6, 2
STOCK = {
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeSparseMoeBlock),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeSparseMoeBlock),
    "olmoe": (OlmoeConfig, OlmoeSparseMoeBlock),
}


def _pair(family: str, norm_topk_prob: bool, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    config_class, block_class = STOCK[family]
    config = config_class(
        hidden_size=C, moe_intermediate_size=F, intermediate_size=F, shared_expert_intermediate_size=S,
        num_experts=E, num_experts_per_tok=K, norm_topk_prob=norm_topk_prob,
    )  # fmt: skip
    config._experts_implementation = "eager"
    stock = block_class(config)
    shared = S if family == "qwen2_moe" else 0
    spec = MoESpec(
        C, F, E, K, routing="softmax_top_k_in_logits_dtype", norm_topk_prob=norm_topk_prob, shared_expert_size=shared
    )
    ours = MixtureOfExperts(spec)
    with torch.no_grad():
        for p in stock.parameters():
            p.normal_(0, 0.3)
    copy_stock_moe_block(stock, ours)
    return stock.to(dtype), ours.to(dtype)


@pytest.mark.parametrize("family", sorted(STOCK))
@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_matches_stock_sparse_block(family, norm_topk_prob):
    stock, ours = _pair(family, norm_topk_prob)
    x = torch.randn(2, 9, C)
    with torch.no_grad():
        assert (stock(x.clone()) - ours(x)).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_bf16_weighting_matches_stock(family):
    """In bf16 stock casts the routing weights to bf16 before weighting; so does this routing rule."""
    stock, ours = _pair(family, norm_topk_prob=False, dtype=torch.bfloat16)
    x = torch.randn(3, 7, C, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(stock(x.clone()), ours(x))


def test_shared_expert_is_there_only_when_asked():
    assert isinstance(MixtureOfExperts(MoESpec(C, F, E, K, shared_expert_size=S)).shared_expert, SharedExpert)
    absent = MixtureOfExperts(MoESpec(C, F, E, K))
    assert isinstance(absent.shared_expert, NoSharedExpert)
    assert not any("shared" in name for name in absent.state_dict())


def test_shared_expert_adds_its_gated_output():
    torch.manual_seed(0)
    moe = MixtureOfExperts(MoESpec(C, F, E, K, shared_expert_size=S))
    torch.nn.init.normal_(moe.router.weight)
    torch.nn.init.normal_(moe.shared_expert.gate.weight)
    x = torch.randn(4, C)
    routed = MixtureOfExperts.dispatch(moe, x, *ROUTINGS["softmax_top_k"](moe.router(x), K, True))
    expected = routed + torch.sigmoid(moe.shared_expert.gate(x)) * moe.shared_expert.expert(x)
    assert torch.allclose(moe(x[None])[0], expected, atol=1e-6)


def test_unknown_routing_and_expert_kind_are_named():
    with pytest.raises(ValueError, match=r"unknown routing 'sigmoid'.*softmax_top_k"):
        MoESpec(C, F, E, K, routing="sigmoid")
    with pytest.raises(ValueError, match=r"unknown expert kind 'dense'.*gated"):
        MoESpec(C, F, E, K, expert="dense")


def test_router_bias_is_a_part():
    moe = MixtureOfExperts(MoESpec(C, F, E, K, router_bias=True))
    assert moe.router.bias is not None and moe.router.bias.shape == (E,)
    assert MixtureOfExperts(MoESpec(C, F, E, K)).router.bias is None


def test_every_expert_and_the_shared_one_get_gradients():
    torch.manual_seed(0)
    moe = MixtureOfExperts(MoESpec(8, 16, 4, 1, shared_expert_size=16, routing="softmax_top_k_in_logits_dtype"))
    torch.nn.init.normal_(moe.router.weight)
    moe(torch.randn(1, 1, 8)).sum().backward()
    assert all(p.grad is not None for p in moe.parameters())
    assert sum(bool(e.down_proj.weight.grad.abs().sum()) for e in moe.experts) == 1


def test_fused_expert_layout_reads_into_per_expert_tensors():
    """Stock's fused experts ([E, 2F, C] gate/up, [E, C, F] down) become one tensor per expert projection; the
    rules read only (the export writes the per-expert layout)."""
    from fivefold.conversion.errors import ConversionError
    from fivefold.conversion.experts import fused_expert_rules
    from fivefold.conversion.keymap import KeyMap

    torch.manual_seed(0)
    gate_up, down = torch.randn(3, 2 * F, C), torch.randn(3, C, F)
    stock = {"model.layers.0.mlp.experts.gate_up_proj": gate_up, "model.layers.0.mlp.experts.down_proj": down}
    keys = KeyMap(fused_expert_rules("layers.{}.mlp.experts", "layers.{}.mlp.experts", 3))
    plan = keys.plan(stock, "model", "model")
    ours = {k: v for step in plan.steps for k, v in plan.run(step, stock.__getitem__).items()}
    assert plan.target_shapes({k: v.shape for k, v in stock.items()}) == {k: v.shape for k, v in ours.items()}
    for e in range(3):
        assert torch.equal(ours[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"], gate_up[e, :F])
        assert torch.equal(ours[f"model.layers.0.mlp.experts.{e}.up_proj.weight"], gate_up[e, F:])
        assert torch.equal(ours[f"model.layers.0.mlp.experts.{e}.down_proj.weight"], down[e])
    with pytest.raises(ConversionError, match="match no conversion rule"):
        keys.plan(ours, "model", "model", inverse=True)
