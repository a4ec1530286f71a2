"""Run by torchrun: every architecture's tiny model trains three SGD steps with Trainer and gradient checkpointing
(so Trainer passes find_unused_parameters=False to DDP). The dataset is one global batch, split over the ranks, so
that runs on any number of processes see the same batches; rank 0 saves the trained weights, and each rank says
how far its weights are from rank 0's."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from task_classes import TASK_CLASSES
from torch import nn

from fivefold.architectures import ARCHITECTURES

torch.set_num_threads(1)
transformers.utils.logging.set_verbosity_error()
folder = Path(sys.argv[1])
SAMPLES = 4


def batch_for(arch, config) -> dict:
    gen = torch.Generator().manual_seed(0)
    if arch.stock_model_type == "vit":
        size = config.image_size
        return {
            "pixel_values": torch.randn(SAMPLES, 3, size, size, generator=gen),
            "labels": torch.randint(0, 2, (SAMPLES,), generator=gen),
        }
    ids = torch.randint(3, 90, (SAMPLES, 8), generator=gen)
    if arch.stock_model_type == "t5":
        return {"input_ids": ids, "labels": torch.randint(3, 90, (SAMPLES, 4), generator=gen)}
    return {"input_ids": ids, "labels": ids}


class Rows(torch.utils.data.Dataset):
    def __init__(self, batch: dict):
        self.batch = batch

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        return {k: v[i] for k, v in self.batch.items()}


def without_dropout(model: nn.Module) -> nn.Module:
    for module in model.modules():  # whatever the config calls its rates
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


results, trained = {}, {}
world = int(os.environ["WORLD_SIZE"])
for arch in ARCHITECTURES:
    cls = arch.class_named(TASK_CLASSES[arch.stock_model_type])
    tiny = {**arch.tiny, "num_experts_per_tok": 1} if arch.stock_model_type == "mixtral" else arch.tiny
    config = arch.config_class(**tiny, num_labels=2)
    torch.manual_seed(0)
    model = without_dropout(cls(config))
    initial = [p.detach().clone() for p in model.parameters()]
    batch = batch_for(arch, config)
    args = transformers.TrainingArguments(
        output_dir=str(folder / "out"), report_to=[], save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True,
        per_device_train_batch_size=SAMPLES // world, max_steps=3, optim="sgd", learning_rate=1e-3,
        lr_scheduler_type="constant", max_grad_norm=0.0, gradient_checkpointing=True, dataloader_num_workers=0,
    )  # fmt: skip
    transformers.Trainer(model=model, args=args, train_dataset=Rows(batch)).train()

    vs_rank_0 = 0.0
    for p in model.parameters():
        theirs = p.detach().clone()
        dist.broadcast(theirs, 0)
        vs_rank_0 = max(vs_rank_0, (p - theirs).abs().max().item())
    moved = max((p - q).abs().max().item() for p, q in zip(model.parameters(), initial, strict=True))
    results[arch.stock_model_type] = {"vs_rank_0": vs_rank_0, "moved": moved}
    trained[arch.stock_model_type] = {k: v.detach().clone() for k, v in model.state_dict().items()}
(folder / f"result-{dist.get_rank()}.json").write_text(json.dumps(results))
if dist.get_rank() == 0:
    torch.save(trained, folder / f"trained-{world}.pt")
