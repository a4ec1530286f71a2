"""Rank 1 killed (SIGKILL) in the middle of an expert-parallel generate(), an expert-parallel training step or a DDP
step of a tiny Mixtral: the case is argv[2] ("ddp", "ep-train", else generate). Each rank writes its pid; rank 1
writes the time it killed itself."""

import datetime
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers.distributed import DistributedConfig

import fivefold

folder, case = Path(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
# What docs/distributed.md asks of every job: a bound on how long a collective waits for a peer.
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
(folder / f"{case}-pid-{rank}").write_text(str(os.getpid()))
config = fivefold.FivefoldMixtralConfig(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
)  # fmt: skip
checkpoint = folder / f"{case}-checkpoint"
if rank == 0:
    torch.manual_seed(0)
    fivefold.FivefoldMixtralForCausalLM(config).save_pretrained(checkpoint)
dist.barrier()

calls = 0


def die_on_the_third_call(module, inputs) -> None:
    global calls
    calls += 1
    if rank == 1 and calls == 3:
        (folder / f"{case}-killed-at").write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(0))
if case == "ddp":
    model = fivefold.FivefoldMixtralForCausalLM.from_pretrained(checkpoint).train()
    ddp = DistributedDataParallel(model)
    model.model.layers[1].register_forward_pre_hook(die_on_the_third_call)
    for _ in range(5):
        ddp(input_ids=ids, labels=ids).loss.backward()
else:
    layout = DistributedConfig(ep_size=2, fsdp_size=2)
    model = fivefold.FivefoldMixtralForCausalLM.from_pretrained(checkpoint, distributed_config=layout)
    model.model.layers[1].mlp.register_forward_pre_hook(die_on_the_third_call)
    if case == "ep-generate":
        model.eval().generate(ids, max_new_tokens=8, do_sample=False, synced_gpus=True, eos_token_id=None)
    else:
        for _ in range(5):
            model.train()(input_ids=ids, labels=ids).loss.backward()
print(f"rank {rank}: finished, which a lost peer should have made impossible", flush=True)
