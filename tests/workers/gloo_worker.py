"""What every worker process shares: the gloo group torchrun's variables describe, the arguments the test wrote, and
the result file it reads back."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

torch.set_num_threads(1)
folder = Path(sys.argv[1])
args = json.loads((folder / "args.json").read_text())


def start() -> tuple[int, int]:
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def finish(result: dict) -> None:
    """Writes this rank's result and, once every rank has written its own, ends the process without the
    interpreter's teardown: gloo's threads outlive `destroy_process_group` where objects such as a DDP reducer still
    hold the group, and freeing them on the way out has aborted a rank ("terminate called without an active
    exception", once in about 20 runs of the DDP test) after every result was written."""
    (folder / f"result-{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def tiny_checkpoints(every_head: bool = False):
    """(architecture, class, a folder holding its tiny checkpoint) for every architecture's task class (or, with
    `every_head`, for every class it has); rank 0 writes the checkpoints, seeded, and every rank reads them."""
    from task_classes import TASK_CLASSES

    from fivefold.architectures import ARCHITECTURES

    for arch in ARCHITECTURES:
        name = arch.stock_model_type
        classes = arch.models.values() if every_head else [arch.class_named(TASK_CLASSES[name])]
        for cls in classes:
            path = folder / cls.__name__
            if dist.get_rank() == 0:
                torch.manual_seed(0)
                cls(arch.config_class(**arch.tiny)).save_pretrained(path)
            dist.barrier()
            yield arch, cls, path


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item() if a.numel() else 0.0


def same_on_every_rank(model: torch.nn.Module) -> float:
    """The largest difference between this rank's parameters and rank 0's."""
    worst = 0.0
    for p in model.parameters():
        theirs = p.detach().clone()
        dist.broadcast(theirs, 0)
        worst = max(worst, max_diff(p, theirs))
    return worst


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


os.environ.setdefault("HF_HUB_OFFLINE", "1")
