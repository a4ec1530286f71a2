"""Expert parallelism through transformers' API on N ranks: DistributedConfig(ep_size=N, fsdp_size=N). Each rank
loads 1/N of the experts, runs its own batch, and is compared with a one-process model: logits on its batch, expert
and router gradients and the load-balancing loss over the union of the batches, synced generation, the save."""

import torch
import torch.distributed as dist
from gloo_worker import args, finish, folder, max_diff, start
from transformers.distributed import DistributedConfig

import fivefold
from fivefold.modeling.expert_parallel import RemoteExpert

rank, world = start()
layout = DistributedConfig(ep_size=world, fsdp_size=world)
result = {}
try:
    fivefold.FivefoldMixtralForCausalLM.from_pretrained(args["three_experts"], distributed_config=layout)
except ValueError as error:
    result["error"] = str(error)


def vm(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


# The same path once on a tiny model first, so that what is measured below is the big model's weights rather than
# the first call's one-time costs (imports, buffers of the process group and of FSDP2).
warm = fivefold.FivefoldMixtralForCausalLM.from_pretrained(args["tiny"], distributed_config=layout)
with torch.no_grad():
    warm(input_ids=torch.tensor([[5, 6, 7]]))
del warm
before = vm("VmRSS")
# Measured without the copy-on-load of file-backed weights (tested on its own in test_changing_files.py): its
# private copies beside the file's pages, still mapped at the peak, would count this rank's experts twice.
fivefold.FivefoldPreTrainedModel.copy_file_backed_weights = False
ep = fivefold.FivefoldMixtralForCausalLM.from_pretrained(args["checkpoint"], distributed_config=layout)
fivefold.FivefoldPreTrainedModel.copy_file_backed_weights = True
batches = [torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(s)) for s in range(world)]
ids = batches[rank]
result["rss_after_load"] = vm("VmRSS") - before
with torch.no_grad():
    logits = ep(input_ids=ids).logits
result["rss_after_forward"] = vm("VmRSS") - before
result["held_mib"] = sum(p.numel() * 4 for n, p in ep.named_parameters() if ".experts." in n) / 2**20
result["rss_growth_mib"] = vm("VmHWM") - before  # loading and one forward: every weight this rank holds touched
experts = ep.model.layers[0].mlp.experts
result["held"] = [e for e, expert in enumerate(experts) if not isinstance(expert, RemoteExpert)]
full = fivefold.FivefoldMixtralForCausalLM.from_pretrained(args["checkpoint"])
with torch.no_grad():
    result["logits"] = max_diff(logits, full(input_ids=ids).logits)

ep.train(), full.train()
out = ep(input_ids=ids, labels=ids, output_router_logits=True)
out.loss.backward()
union = torch.cat(batches)
ref = full(input_ids=union, labels=union, output_router_logits=True)
ref.loss.backward()
result["aux_loss"] = max_diff(out.aux_loss, ref.aux_loss)
grads = 0.0
for e in result["held"]:
    for p, q in zip(experts[e].parameters(), full.model.layers[0].mlp.experts[e].parameters(), strict=True):
        grads = max(grads, max_diff(p.grad, q.grad))
result["expert_grads"] = grads

router = ep.model.layers[1].mlp.router.weight.grad
result["router_grad"] = max_diff(router.full_tensor(), full.model.layers[1].mlp.router.weight.grad)
ep.eval()

new = [3, 6, 4, 5][rank]  # the ranks finish at different steps
with torch.no_grad():
    got = ep.generate(ids, max_new_tokens=new, do_sample=False, synced_gpus=True, eos_token_id=None, pad_token_id=0)
    want = full.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
result["generate"] = got.tolist() == want.tolist() and got.shape[1] == ids.shape[1] + new

ep.save_pretrained(folder / "saved")
dist.barrier()

# With tensor parallelism instead of FSDP2 (two ranks: the tiny model has two key-value heads): one shared batch.
if world != 2:
    finish(result)
    raise SystemExit
both = fivefold.FivefoldMixtralForCausalLM.from_pretrained(
    args["checkpoint"], distributed_config=DistributedConfig(ep_size=2, tp_size=2)
)
shared = batches[0]
full.zero_grad()
with torch.no_grad():
    result["tp_logits"] = max_diff(both(input_ids=shared).logits, full(input_ids=shared).logits)
both.train()
both(input_ids=shared, labels=shared).loss.backward()
full(input_ids=shared, labels=shared).loss.backward()
tp_experts = both.model.layers[0].mlp.experts
result["tp_expert_grads"] = max(
    max_diff(p.grad, q.grad)
    for e in result["held"]
    for p, q in zip(tp_experts[e].parameters(), full.model.layers[0].mlp.experts[e].parameters(), strict=True)
)
finish(result)
