"""gpt-oss under expert parallelism on N ranks: DistributedConfig(ep_size=N, fsdp_size=N). Each rank holds 1/N of
the experts (with their biases and clamped SwiGLU), tokens travel by all-to-all, and its logits on its own batch,
its load-balancing loss and its synced greedy generation equal one process's."""

import torch
from gloo_worker import args, finish, max_diff, start
from transformers.distributed import DistributedConfig

from fivefold import FivefoldGptOssForCausalLM
from fivefold.modeling.expert_parallel import RemoteExpert

rank, world = start()
ep = FivefoldGptOssForCausalLM.from_pretrained(
    args["checkpoint"], distributed_config=DistributedConfig(ep_size=world, fsdp_size=world)
).eval()
full = FivefoldGptOssForCausalLM.from_pretrained(args["checkpoint"]).eval()
batches = [torch.randint(3, 99, (2, 10), generator=torch.Generator().manual_seed(s)) for s in range(world)]
ids = batches[rank]  # longer than the sliding window
result = {"held": [e for e, x in enumerate(ep.model.layers[0].mlp.experts) if not isinstance(x, RemoteExpert)]}
with torch.no_grad():
    out = ep(input_ids=ids, output_router_logits=True)
    ref = full(input_ids=ids, output_router_logits=True)
    result["logits"] = max_diff(out.logits, ref.logits)
    new = [3, 5, 4, 6][rank]  # the ranks finish at different steps
    got = ep.generate(ids, max_new_tokens=new, do_sample=False, synced_gpus=True, eos_token_id=None, pad_token_id=0)
    want = full.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
result["generate"] = got.tolist() == want.tolist()
finish(result)
