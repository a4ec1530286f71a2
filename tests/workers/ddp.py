"""DDP on a tiny Mixtral (4 experts, top-1) whose rank 1 sees two tokens, so that some experts get no token there:
every DDP mode runs three SGD steps and ends equal to one process stepping on the mean of both ranks' losses."""

import copy

import torch
from gloo_worker import args, finish, max_diff, same_on_every_rank, start
from torch.nn.parallel import DistributedDataParallel

import fivefold

rank, world = start()
config = fivefold.FivefoldMixtralConfig(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=40, num_local_experts=4, num_experts_per_tok=1, output_router_logits=True,
    router_aux_loss_coef=0.02, use_cache=False,
)  # fmt: skip
torch.manual_seed(0)
initial = fivefold.FivefoldMixtralForCausalLM(config).train()
batches = [torch.randint(3, 99, (2, 8), generator=torch.Generator().manual_seed(1)), torch.tensor([[5, 9]])]


def loss_of(model, ids):
    return model(input_ids=ids, labels=ids).loss


def idle_experts(model, ids) -> int:
    """How many (layer, expert) pairs no token of `ids` chose."""
    with torch.no_grad():
        logits = model(input_ids=ids).router_logits
    return sum(len(set(range(4)) - set(layer.argmax(-1).tolist())) for layer in logits)


result = {"idle_on_rank_1": idle_experts(initial, batches[1])}
for mode in args["modes"]:
    model, reference = copy.deepcopy(initial), copy.deepcopy(initial)
    if mode["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=mode["checkpointing"])
    ddp = DistributedDataParallel(model, **mode["ddp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        loss_of(ddp, batches[rank]).backward()
        optimizer.step()
        ref_optimizer.zero_grad()
        (sum(loss_of(reference, ids) for ids in batches) / world).backward()
        ref_optimizer.step()
    reference_diff = max(max_diff(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True))
    result[mode["name"]] = {"vs_one_process": reference_diff, "vs_rank_0": same_on_every_rank(model)}
finish(result)
