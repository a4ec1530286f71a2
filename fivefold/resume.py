"""Which checkpoint a killed training job resumes from. Trainer writes `checkpoint-N` in place, file after file:
the weights (which fivefold's save_pretrained swaps in whole), the optimizer and scheduler, each rank's RNG state,
and last `trainer_state.json`. A job killed in between leaves a `checkpoint-N` that `resume_from_checkpoint=True`
picks (transformers takes the highest N) and resumes wrongly: without the trainer state it starts again at step 0
from step N's weights, without a rank's RNG state its dropout draws differ. The last complete checkpoint is the
highest N with all of them."""

import os
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

TRAINER_STATE = "trainer_state.json"


def last_complete_checkpoint(output_dir: str | os.PathLike, world_size: int | None = None) -> str | None:
    """The highest `checkpoint-N` under `output_dir` holding its trainer state (written after the weights and the
    optimizer) and the RNG state of each of `world_size` ranks (torch.distributed's world size if initialised,
    else 1); None if there is none.
    Pass it as `trainer.train(resume_from_checkpoint=...)`; a None starts from scratch."""
    if world_size is None:
        import torch.distributed as dist

        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    rng = ["rng_state.pth"] if world_size == 1 else [f"rng_state_{rank}.pth" for rank in range(world_size)]
    found = []
    for folder in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        step = folder.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")
        if step.isdigit() and folder.is_dir() and all((folder / name).is_file() for name in [TRAINER_STATE, *rng]):
            found.append((int(step), folder))
    return str(max(found)[1]) if found else None
