"""A quantized Mixtral under expert parallelism on N ranks, each layout (FSDP2's and tensor parallelism's), from an
unquantized folder quantized as it loads and from a saved quantized folder: against the same quantized model in one
process, its logits and synced generation; training and saving refused with their errors."""

import torch
import torch.distributed as dist
import transformers
from gloo_worker import args, finish, max_diff, start
from torchao.quantization import Int8WeightOnlyConfig
from transformers.distributed import DistributedConfig

import fivefold
from fivefold.modeling.expert_parallel import RemoteExpert
from fivefold.modeling.quantization import quantized_modules

rank, world = start()
batches = [torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(r)) for r in range(world)]
ids = batches[rank]
new = [3, 5][rank]  # the ranks finish at different steps
greedy = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
quantizers = {"torchao": transformers.TorchAoConfig(Int8WeightOnlyConfig())}
if args["bitsandbytes"]:
    quantizers["bitsandbytes"] = transformers.BitsAndBytesConfig(load_in_8bit=True)
cases = [(f"{name} at load, {layout}", args["checkpoint"], {"quantization_config": q}, layout)
         for name, q in quantizers.items() for layout in ("fsdp", "tp")]  # fmt: skip
cases.append(("saved torchao, fsdp", args["saved"], {}, "fsdp"))


def refused(train: bool) -> str:
    """The error of a training step through `ep`, in training mode or not."""
    ep.train(train)
    try:
        ep(input_ids=ids, labels=ids).loss.backward()
    except RuntimeError as error:
        return str(error)
    return "trained"


result = {}
for case, path, kwargs, layout in cases:
    sizes = {"fsdp_size": world} if layout == "fsdp" else {"tp_size": world}
    config = DistributedConfig(ep_size=world, **sizes)
    ep = fivefold.FivefoldMixtralForCausalLM.from_pretrained(path, distributed_config=config, **kwargs)
    one = fivefold.FivefoldMixtralForCausalLM.from_pretrained(path, **kwargs)
    experts = ep.model.layers[0].mlp.experts
    with torch.no_grad():
        got = ep.generate(ids, max_new_tokens=new, synced_gpus=True, **greedy)
        want = one.generate(ids, max_new_tokens=new, **greedy).tolist()
        # A static cache holds the steps of the longest rank only when every rank asks for as many.
        static = ep.generate(ids, max_new_tokens=4, synced_gpus=True, cache_implementation="static", **greedy)
        static_want = one.generate(ids, max_new_tokens=4, cache_implementation="static", **greedy).tolist()
        # Every rank its own batch (FSDP2's layout): the load-balancing loss over both, as one process on the union.
        union = torch.cat(batches) if layout == "fsdp" else ids
        aux = ep(input_ids=ids, output_router_logits=True).aux_loss
        row = {
            "held": [e for e, expert in enumerate(experts) if not isinstance(expert, RemoteExpert)],
            "quantized": [len(quantized_modules(ep)), len(quantized_modules(one))],
            "logits": max_diff(ep(input_ids=ids).logits, one(input_ids=ids).logits),
            "generate": got.tolist() == want and static.tolist() == static_want,
            "aux_loss": max_diff(aux, one(input_ids=union, output_router_logits=True).aux_loss),
        }
        ep.train()
        ep(input_ids=ids)  # training mode without gradients: inference still
    row["training"], row["training_in_eval_mode"] = refused(True), refused(False)
    try:
        ep.save_pretrained(args["folder"])
    except NotImplementedError as error:
        row["saving"] = str(error)
    result[case] = row
    dist.barrier()
finish(result)
