"""DistributedConfig(pp_size=2) for the task class of every architecture: refused at load with a clear error, or the
logits equal one process's and greedy generate gives the same tokens."""

import torch
import transformers
from gloo_worker import finish, max_diff, start, tiny_checkpoints
from transformers.distributed import DistributedConfig

from fivefold.conversion.architecture import stock_class_name

rank, world = start()
transformers.utils.logging.set_verbosity_error()
GREEDY = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False)
result = {}
for arch, cls, path in tiny_checkpoints():
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
        if cls.can_generate():
            prompt = {k: batch[k] for k in ("input_ids", "attention_mask")}
            entry["same_tokens"] = torch.equal(split.generate(**prompt, **GREEDY), single.generate(**prompt, **GREEDY))
    result[cls.__name__] = entry
finish(result)
