"""DistributedConfig(tp_size=2) for every architecture: logits on the same batch equal one process's."""

import torch
import transformers
from gloo_worker import finish, max_diff, start, tiny_checkpoints
from transformers.distributed import DistributedConfig

rank, world = start()
transformers.utils.logging.set_verbosity_error()
result = {}
for name, cls, path in tiny_checkpoints():
    single = cls.from_pretrained(path).eval()
    sharded = cls.from_pretrained(path, distributed_config=DistributedConfig(tp_size=world)).eval()
    gen = torch.Generator().manual_seed(0)
    if name == "vit":
        size = single.config.image_size
        batch = {"pixel_values": torch.randn(2, 3, size, size, generator=gen)}
    else:
        batch = {"input_ids": torch.randint(3, 90, (2, 7), generator=gen)}
        if name == "t5":
            batch["decoder_input_ids"] = torch.randint(3, 90, (2, 5), generator=gen)
    q = sharded.get_submodule(next(k for k in sharded.tp_plan if k.endswith("q_proj")).replace("*", "0"))
    with torch.no_grad():
        want = single(**batch).logits
        exact = single.double()(**{k: v.double() if v.is_floating_point() else v for k, v in batch.items()}).logits
        result[name] = {
            "logits": max_diff(sharded(**batch).logits, want),
            "fp32_error": (want.double() - exact).abs().max().item(),  # one process in fp32 against fp64
            "sharded": type(q.weight).__name__ == "DTensor" and q.weight.to_local().shape[0] * world == q.out_features,
        }
finish(result)
