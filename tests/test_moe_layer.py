"""The mixture-of-experts layer on its own: the dense invariant, Mixtral's routing and dispatch against stock's
sparse block on the same weights, gradients, the experts a compiled graph skips, and the auxiliary losses against
stock's formula."""

import pytest
import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func

from fivefold.conversion.experts import copy_stock_moe_block
from fivefold.modeling.feedforward import FeedForwardSpec, GatedFeedForward
from fivefold.modeling.moe import MixtureOfExperts, MoESpec, load_balancing_loss, router_z_loss
from fivefold.modeling.parts import build_feedforward
from fivefold.modeling.routers import softmax_top_k

C, F, E, K = 16, 24, 6, 2


def _pair(num_experts=E, top_k=K, jitter=0.0, seed=0):
    """Stock's block (eager experts) and ours with identical weights."""
    torch.manual_seed(seed)
    config = MixtralConfig(
        hidden_size=C, intermediate_size=F, num_local_experts=num_experts, num_experts_per_tok=top_k,
        router_jitter_noise=jitter,
    )  # fmt: skip
    config._experts_implementation = "eager"
    stock = MixtralSparseMoeBlock(config)
    ours = MixtureOfExperts(MoESpec(C, F, num_experts, top_k, jitter_noise=jitter))
    with torch.no_grad():
        stock.gate.weight.normal_(0, 1.0)
        stock.experts.gate_up_proj.normal_(0, 0.2)
        stock.experts.down_proj.normal_(0, 0.2)
    copy_stock_moe_block(stock, ours)
    return stock, ours


def test_one_expert_top1_equals_dense_swiglu():
    torch.manual_seed(0)
    dense = GatedFeedForward(FeedForwardSpec("gated", C, F, "silu", bias=False))
    moe = build_feedforward(MoESpec(C, F, num_experts=1, top_k=1))
    assert isinstance(moe, MixtureOfExperts)
    moe.experts[0].load_state_dict(dense.state_dict())
    torch.nn.init.normal_(moe.router.weight)
    x = torch.randn(3, 5, C)
    assert torch.allclose(moe(x), dense(x), atol=1e-6)


@pytest.mark.parametrize(("num_experts", "top_k"), [(E, K), (E, 1), (E, E), (64, 8)])
def test_matches_stock_sparse_block(num_experts, top_k):
    stock, ours = _pair(num_experts, top_k)
    x = torch.randn(2, 9, C)
    with torch.no_grad():
        assert (stock(x.clone()) - ours(x)).abs().max() <= 1e-5


def test_experts_without_tokens_are_skipped():
    stock, ours = _pair()
    with torch.no_grad():  # positive inputs: experts 0 and 1 score below zero, the others above, on every token
        ours.router.weight.abs_()
        ours.router.weight[:2] = -1.0
        stock.gate.weight.copy_(ours.router.weight)
    calls = []
    for e, expert in enumerate(ours.experts):
        expert.register_forward_hook(lambda m, i, o, e=e: calls.append(e))
    x = torch.rand(2, 7, C) + 0.1
    with torch.no_grad():
        assert (stock(x.clone()) - ours(x)).abs().max() <= 1e-5
    assert calls and 0 not in calls and 1 not in calls
    assert calls == sorted(calls)  # one call per expert, tokens grouped


@pytest.mark.slow  # dynamo: a few seconds
def test_compiled_inference_skips_experts_without_tokens_inside_the_graph():
    """Compiled without gradients, each expert runs behind `torch.cond` on whether a token chose it: experts 0 and 1,
    chosen by no token and holding NaN weights, leave the output as eager's. With gradients (training) the graph
    runs every expert on every token, weighted by zero where not chosen: NaN shows it ran them."""
    stock, ours = _pair()
    with torch.no_grad():  # positive inputs: experts 0 and 1 score below zero, the others above, on every token
        ours.router.weight.abs_()
        ours.router.weight[:2] = -1.0
        stock.gate.weight.copy_(ours.router.weight)
        for expert in ours.experts[:2]:
            expert.down_proj.weight.fill_(float("nan"))
    x = torch.rand(2, 7, C) + 0.1
    torch._dynamo.reset()
    try:
        compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            assert (compiled(x) - stock(x.clone())).abs().max() <= 1e-5
        assert compiled(x).isnan().all()
    finally:
        torch._dynamo.reset()


@pytest.mark.slow  # dynamo and torch.export: a few seconds
def test_graphs_where_cond_cannot_go_run_every_expert():
    """An fp64 layer compiles with `torch.cond` (its branches agree on the dtype); a layer whose expert has a hook
    (which a `torch.cond` branch could not trace whole) compiles on the dense path; an export holds no `cond`.
    Each equals eager."""
    _, ours = _pair()
    x = torch.randn(2, 5, C)
    calls = []
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            wide = ours.double()
            assert torch.allclose(torch.compile(wide, backend="aot_eager")(x.double()), wide(x.double()))
            ours.float()
            exported = torch.export.export(ours, (x,))
            assert not any(node.target is torch.ops.higher_order.cond for node in exported.graph.nodes)
            assert torch.allclose(exported.module()(x), ours(x), atol=1e-6)
            ours.experts[0].register_forward_hook(lambda module, args, out: calls.append(out.shape))
            assert torch.allclose(torch.compile(ours, backend="aot_eager")(x), ours(x), atol=1e-6)
    finally:
        torch._dynamo.reset()
    assert calls


def test_no_tokens():
    _, ours = _pair()
    assert ours(torch.randn(2, 0, C)).shape == (2, 0, C)


def test_gradients_match_stock():
    stock, ours = _pair()
    x = torch.randn(2, 5, C)
    xs, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    stock(xs).square().sum().backward()
    ours(xo).square().sum().backward()
    assert (xs.grad - xo.grad).abs().max() <= 1e-5
    assert (stock.gate.weight.grad - ours.router.weight.grad).abs().max() <= 1e-5
    grad_up = torch.stack([e.up_proj.weight.grad for e in ours.experts])
    assert (stock.experts.gate_up_proj.grad[:, F:] - grad_up).abs().max() <= 1e-5


def test_jitter_noise_as_stock_in_training_only():
    stock, ours = _pair(jitter=0.1)
    x = torch.randn(2, 5, C)
    stock.train(), ours.train()
    with torch.no_grad():
        torch.manual_seed(3)
        expected = stock(x.clone())
        torch.manual_seed(3)
        got = ours(x)
        assert (expected - got).abs().max() <= 1e-5  # the same draws, applied to the same inputs
        assert not torch.allclose(got, ours.eval()(x))
        assert torch.equal(ours(x), ours(x))  # no noise in eval


def test_routing_weights_follow_mixtral():
    _, ours = _pair()
    x = torch.randn(11, C)
    logits = ours.router(x)
    weights, experts = softmax_top_k(logits, K)
    probs = logits.float().softmax(-1)
    assert torch.equal(experts, probs.topk(K, dim=-1).indices)
    assert torch.allclose(weights, probs.gather(1, experts) / probs.gather(1, experts).sum(-1, keepdim=True))
    assert weights.dtype == torch.float32


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_equals_stock(masked):
    torch.manual_seed(0)
    batch, steps, layers = 3, 7, 4
    logits = tuple(torch.randn(batch * steps, E) * 2 for _ in range(layers))
    mask = (torch.arange(steps)[None] < torch.tensor([[7], [4], [2]])).long() if masked else None
    expected = load_balancing_loss_func(logits, E, K, mask)
    assert torch.allclose(load_balancing_loss(logits, K, mask), expected, atol=1e-6)


def test_router_z_loss():
    torch.manual_seed(0)
    logits = (torch.randn(6, E), torch.randn(6, E))
    manual = torch.cat(logits).logsumexp(-1).square().mean()
    assert torch.allclose(router_z_loss(logits), manual)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # 3 of 6 rows are tokens, in every layer
    keep = mask.reshape(-1).bool().repeat(2)
    assert torch.allclose(router_z_loss(logits, mask), torch.cat(logits)[keep].logsumexp(-1).square().mean())


def test_spec_refuses_more_experts_per_token_than_experts():
    with pytest.raises(ValueError, match="top_k"):
        MoESpec(C, F, num_experts=2, top_k=3)


def test_an_expert_without_tokens_gets_a_zero_gradient_not_none():
    """So that data-parallel training sees every parameter used on every rank (tests/test_distributed_ddp.py)."""
    torch.manual_seed(0)
    moe = MixtureOfExperts(MoESpec(hidden_size=8, expert_size=12, num_experts=4, top_k=1))
    torch.nn.init.normal_(moe.router.weight)
    x = torch.randn(1, 1, 8)
    moe(x).sum().backward()
    grads = [expert.down_proj.weight.grad for expert in moe.experts]
    assert all(g is not None for g in grads)
    assert sum(bool(g.abs().sum()) for g in grads) == 1  # one token, top-1: three idle experts with zero gradients
