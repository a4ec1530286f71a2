"""Expert parallelism on a Qwen3-MoE (per-head q/k norms, a dense layer between MoE layers) over 2 ranks:
DistributedConfig(ep_size=2, fsdp_size=2), each rank its own batch, then DistributedConfig(ep_size=2, tp_size=2),
one shared batch; each compared with the one-process model (logits, the load-balancing loss, expert gradients)."""

import torch
from gloo_worker import args, finish, max_diff, start
from transformers.distributed import DistributedConfig

import fivefold
from fivefold.modeling.expert_parallel import RemoteExpert

rank, world = start()
cls = getattr(fivefold, args["class"])
result = {}
ep = cls.from_pretrained(args["checkpoint"], distributed_config=DistributedConfig(ep_size=world, fsdp_size=world))
full = cls.from_pretrained(args["checkpoint"])
batches = [torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(s)) for s in range(world)]
ids = batches[rank]
moe = next(layer.mlp for layer in ep.model.layers if hasattr(layer.mlp, "experts"))
index = list(ep.model.layers).index(next(layer for layer in ep.model.layers if layer.mlp is moe))
result["held"] = [e for e, expert in enumerate(moe.experts) if not isinstance(expert, RemoteExpert)]
with torch.no_grad():
    result["logits"] = max_diff(ep(input_ids=ids).logits, full(input_ids=ids).logits)
ep.train(), full.train()
out = ep(input_ids=ids, labels=ids, output_router_logits=True)
out.loss.backward()
union = torch.cat(batches)
ref = full(input_ids=union, labels=union, output_router_logits=True)
ref.loss.backward()
result["aux_loss"] = max_diff(out.aux_loss, ref.aux_loss)
reference = full.model.layers[index].mlp.experts
result["expert_grads"] = max(
    max_diff(p.grad, q.grad)
    for e in result["held"]
    for p, q in zip(moe.experts[e].parameters(), reference[e].parameters(), strict=True)
)
both = cls.from_pretrained(args["checkpoint"], distributed_config=DistributedConfig(ep_size=world, tp_size=world))
full.eval()
with torch.no_grad():
    result["tp_logits"] = max_diff(both(input_ids=batches[0]).logits, full(input_ids=batches[0]).logits)
finish(result)
