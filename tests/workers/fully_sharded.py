"""FSDP2 through DistributedConfig(fsdp_size=2) for every architecture: each rank trains three SGD steps on its own
batch and ends equal to one process stepping on the union of the batches; the sharded save is the ordinary
checkpoint of those weights."""

import torch
import torch.distributed as dist
import transformers
from gloo_worker import finish, folder, max_diff, start, tiny_checkpoints
from torch import nn
from transformers.distributed import DistributedConfig

rank, world = start()
transformers.utils.logging.set_verbosity_error()


def batch_for(name: str, config, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    if name == "vit":
        size = config.image_size
        return {"pixel_values": torch.randn(2, 3, size, size, generator=gen), "labels": torch.tensor([0, 1])}
    ids = torch.randint(3, 90, (2, 7), generator=gen)
    if name == "t5":
        return {"input_ids": ids, "labels": torch.randint(3, 90, (2, 4), generator=gen)}
    return {"input_ids": ids, "labels": ids}


def without_dropout(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model.train()


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


result = {}
for arch, cls, path in tiny_checkpoints():
    name = arch.stock_model_type
    single = without_dropout(cls.from_pretrained(path))
    sharded = without_dropout(cls.from_pretrained(path, distributed_config=DistributedConfig(fsdp_size=world)))
    initial = {k: v.detach().clone() for k, v in single.state_dict().items()}
    batches = [batch_for(name, single.config, seed) for seed in range(world)]
    union = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-3) for m in (single, sharded)]
    for _ in range(3):
        for model, batch, optimizer in zip((single, sharded), (union, batches[rank]), optimizers, strict=True):
            optimizer.zero_grad()
            model(**batch).loss.backward()
            optimizer.step()
    trained = {k: full(v).detach() for k, v in sharded.state_dict().items()}
    reference = single.state_dict()
    sharded.save_pretrained(folder / f"saved-{name}")
    dist.barrier()
    saved = cls.from_pretrained(folder / f"saved-{name}").state_dict()
    result[name] = {
        "sharded": any(hasattr(p, "device_mesh") for p in sharded.parameters()),
        "tied": [
            m.get_output_embeddings().weight is m.get_input_embeddings().weight
            for m in (single, sharded)
            if m.get_output_embeddings() is not None
        ],
        "vs_one_process": max(max_diff(trained[k], reference[k]) for k in reference),
        "moved": max(max_diff(reference[k], v) for k, v in initial.items()),
        "saved": max(max_diff(saved[k], trained[k]) for k in reference),
    }
finish(result)
