"""DistributedConfig(pp_size=2) for one class of every architecture (a decoder's causal LM): refused at load with a
clear error, or the logits equal one process's and greedy generate gives the same tokens."""

import torch
import torch.distributed as dist
import transformers
from gloo_worker import finish, folder, max_diff, start
from transformers.distributed import DistributedConfig

from fivefold.architectures import ARCHITECTURES
from fivefold.conversion.architecture import stock_class_name

rank, world = start()
transformers.utils.logging.set_verbosity_error()
GREEDY = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False)
result = {}
for arch in ARCHITECTURES:
    # The causal LM of a decoder (what pipeline parallelism splits), else the architecture's first class.
    cls = arch.models.get("AutoModelForCausalLM") or next(iter(arch.models.values()))
    path = folder / cls.__name__
    if rank == 0:
        torch.manual_seed(0)
        cls(arch.config_class(**arch.tiny)).save_pretrained(path)
    dist.barrier()
    try:
        split = cls.from_pretrained(path, distributed_config=DistributedConfig(pp_size=world)).eval()
    except ValueError as error:
        result[cls.__name__] = {"refused": str(error)}
        continue
    single = cls.from_pretrained(path).eval()
    batch = arch.sample_inputs(single.config, stock_class_name(cls), 0)
    layers = sum(not isinstance(layer, torch.nn.Identity) for layer in split.model.layers)
    with torch.no_grad():
        entry = {"refused": None, "layers": layers, "logits": max_diff(split(**batch).logits, single(**batch).logits)}
        try:  # a stage holds a share of the layers: saving it must not write a partial checkpoint
            split.save_pretrained(folder / f"{cls.__name__}-saved")
            entry["save"] = "saved"
        except NotImplementedError as error:
            entry["save"] = str(error)
        entry["save_wrote"] = (folder / f"{cls.__name__}-saved").exists()
        if cls.can_generate():
            prompt = {k: batch[k] for k in ("input_ids", "attention_mask")}
            entry["same_tokens"] = torch.equal(split.generate(**prompt, **GREEDY), single.generate(**prompt, **GREEDY))
    result[cls.__name__] = entry
finish(result)
