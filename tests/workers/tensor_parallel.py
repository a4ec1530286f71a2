"""DistributedConfig(tp_size=2) for every class of every architecture: the output on the same (padded) batch
equals one process's, and the attention weights are DTensors holding half the rows."""

import torch
import transformers
from gloo_worker import finish, max_diff, start, tiny_checkpoints
from transformers.distributed import DistributedConfig

from fivefold.conversion.architecture import stock_class_name

rank, world = start()
transformers.utils.logging.set_verbosity_error()
result = {}
for arch, cls, path in tiny_checkpoints(every_head=True):
    single = cls.from_pretrained(path).eval()
    sharded = cls.from_pretrained(path, distributed_config=DistributedConfig(tp_size=world)).eval()
    batch = arch.sample_inputs(single.config, stock_class_name(cls), 0)
    q = sharded.get_submodule(next(k for k in sharded.tp_plan if k.endswith("q_proj")).replace("*", "0"))
    with torch.no_grad():
        out = single(**batch)
        want = out.logits if "logits" in out else out[0]
        got = sharded(**batch)
        got = got.logits if "logits" in got else got[0]
        exact = single.double()(**{k: v.double() if v.is_floating_point() else v for k, v in batch.items()})
        exact = exact.logits if "logits" in exact else exact[0]
    result[cls.__name__] = {
        "output": max_diff(got, want),
        "fp32_error": (want.double() - exact).abs().max().item(),  # one process in fp32 against fp64
        "sharded": type(q.weight).__name__ == "DTensor" and q.weight.to_local().shape[0] * world == q.out_features,
    }
finish(result)
