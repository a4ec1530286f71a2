"""A training loop's state, saved so that a killed job resumes exactly: the model, the optimizer, the scheduler, the
step and every rank's random number generators, for a model sharded in any way torch.distributed.checkpoint (DCP)
understands (FSDP2, expert parallelism, DDP, one process). Each rank writes its own part; nothing is gathered.

Written whole or not at all: a save goes into `.checkpoint-N.partial` beside the earlier ones; once DCP has written
every rank's part (its coordinator collects the ranks' results before it writes the metadata), rank 0 renames the
folder `checkpoint-N` in one step and tells every rank how that went, so that the ranks leave the save together, with
its error if rank 0's part of the work failed. A job killed during a save leaves the earlier checkpoints as they
were and a partial folder that nothing reads (the next save removes it). `load_training_state` restores the highest
`checkpoint-N`.

Loading never runs code from the folder: DCP reads its `.metadata` with a plain `pickle.load` and keeps the
non-tensor values (the optimizer's hyperparameters, the scheduler's counters) as pickles it unpickles with
`weights_only=False`. Here the metadata is first read with only the types it holds, and the values with
`weights_only=True`, as fivefold reads every `.bin`."""

import io
import json
import logging
import os
import pickle
import random
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from fivefold.modeling.rank_zero import on_rank_0

logger = logging.getLogger(__name__)
PREFIX, PARTIAL = "checkpoint-", ".partial"
STATE = "training_state.json"  # the step and the world size; rank 0 writes it last, before the rename
# Optimizer state and hyperparameters by parameter name. Unflattened, each param group lists its parameters' names
# under one key that every rank writes, and DCP keeps such a key from one rank only; with expert parallelism the
# ranks hold different experts (measured: two param groups, and the load failed with KeyError 'lr').
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextmanager
def _one_process_is_fine() -> Iterator[None]:
    """Without a process group DCP warns at every call that it assumes one process: here that is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
        yield


def _rng_state() -> dict[str, torch.Tensor]:
    """This process's generators as tensors and numbers (no pickled objects): torch's CPU and CUDA generators,
    Python's `random`, and numpy's global one when numpy is there."""
    version, words, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(), "python": torch.tensor(words), "python_extra": [version, gauss]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np
    except ImportError:
        return state
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state |= {"numpy": torch.from_numpy(keys.astype(np.int64)), "numpy_extra": [kind, position, has_gauss, cached]}
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, gauss = state["python_extra"]
    random.setstate((version, tuple(state["python"].tolist()), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy as np

        kind, position, has_gauss, cached = state["numpy_extra"]
        np.random.set_state((kind, state["numpy"].numpy().astype(np.uint32), position, has_gauss, cached))


def _state(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> dict:
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    state = {"model": model_state, "optimizer": optimizer_state}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def _checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for folder in output_dir.glob(f"{PREFIX}*"):
        step = folder.name.removeprefix(PREFIX)
        if step.isdigit() and (folder / STATE).is_file() and (folder / ".metadata").is_file():
            found.append((int(step), folder))
    return sorted(found)


def last_training_state(output_dir: str | os.PathLike) -> str | None:
    """The highest `checkpoint-N` that `save_training_state` wrote under `output_dir`, or None."""
    found = _checkpoints(Path(output_dir))
    return str(found[-1][1]) if found else None


def save_training_state(
    output_dir: str | os.PathLike,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler=None,
    keep: int | None = None,
) -> Path:
    """Saves the state after `step` optimizer steps as `output_dir/checkpoint-{step}`; every rank calls it, with an
    `output_dir` every rank sees (one file system, as DCP needs). Returns when the checkpoint is complete and visible.
    With `keep`, only the newest `keep` checkpoints stay. `model` is the model as trained (FSDP2- or
    expert-parallel-sharded, DDP-wrapped, or plain)."""
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1 (the checkpoint just written); got {keep}")
    rank, world = _rank_and_world()
    output_dir = Path(output_dir)
    final, partial = output_dir / f"{PREFIX}{step}", output_dir / f".{PREFIX}{step}{PARTIAL}"
    _on_rank_0(lambda: _make_room(output_dir))
    rng = _rng_state()
    state = _state(model, optimizer, scheduler) | {"rng": {f"rank{rank}": rng}}
    with _one_process_is_fine():
        dcp.save(state, checkpoint_id=partial)  # each rank its part; returns once the metadata is written
    about = {"step": step, "world_size": world, "generators": sorted(rng)}

    def put_in_place() -> None:  # every rank's part is on disk: DCP's coordinator saw them before the metadata
        _write_synced(partial / STATE, json.dumps(about))
        _put_in_place(partial, final)
        for _, old in _checkpoints(output_dir)[: -keep if keep else 0]:
            shutil.rmtree(old)

    _on_rank_0(put_in_place)  # nobody returns before the checkpoint can be seen
    return final


def _on_rank_0(work: Callable[[], None]) -> None:
    on_rank_0(work, lambda said: RuntimeError(f"rank 0 could not save the training state: {said}"))


def _make_room(output_dir: Path) -> None:
    """The folder, without what jobs killed while saving left: partial checkpoints, and a checkpoint moved aside."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*output_dir.glob(f".{PREFIX}*{PARTIAL}"), *output_dir.glob(f".{PREFIX}*.old")]:
        shutil.rmtree(stale)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _put_in_place(partial: Path, final: Path) -> None:
    """One rename makes the checkpoint visible. An older one of the same step (a job resumed from before it) is
    moved aside first: killed in between, the step is missing, never half-written."""
    if final.exists():
        aside = final.with_name(f".{final.name}.old")
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
        os.rename(partial, final)
        shutil.rmtree(aside)
    else:
        os.rename(partial, final)
    directory = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power loss
    finally:
        os.close(directory)


class NotPlainData(ValueError):
    """A value in a training state that only a full unpickler could load."""


# Every global DCP's `.metadata` pickle names (torch 2.13): its metadata classes, torch's size and layout lookups,
# paths; and torch's dtypes, layouts and memory formats, taken by their type.
_METADATA_GLOBALS = {
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in ("Metadata", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata")
    ),
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in ("ChunkStorageMetadata", "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING")
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    *(("pathlib", name) for name in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles only what a `.metadata` holds; any other global (a function a crafted pickle would call) is refused
    before its module is imported."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        found = getattr(torch, name, None) if module == "torch" else None
        if isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
            return found
        raise NotPlainData(
            f"the training state's .metadata names {module}.{name}, which a checkpoint's metadata never holds, so it "
            "is not loaded: it could run code"
        )


def _check_metadata(folder: Path) -> None:
    """DCP reads `.metadata` with a plain `pickle.load`, which runs whatever the file names: it is read here first,
    with only the types it can hold."""
    with open(folder / ".metadata", "rb") as f:
        _MetadataUnpickler(f).load()


class _WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, with its pickled values read by `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as e:
            raise NotPlainData(
                f"{read_item.dest_index.fqn!r} in the training state is not plain data (numbers, strings, lists, "
                f"tensors), so it is not loaded: it could run code ({e.__class__.__name__})"
            ) from None
        value = io.BytesIO()
        torch.save(loaded, value)
        value.seek(0)
        super().load_bytes(read_item, value)


def load_training_state(
    output_dir: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler=None
) -> int:
    """Restores the last complete `checkpoint-N` under `output_dir` into `model`, `optimizer` and `scheduler` (built
    as for training, on the same layout) and this rank's random number generators; returns N, the steps already
    taken, or 0 if there is no checkpoint (nothing is changed then). Every rank calls it.
    On another number of ranks the weights and the optimizer are resharded, but the generators cannot be
    restored: a warning says so, and dropout and sampling then differ from an uninterrupted run."""
    rank, world = _rank_and_world()
    # Rank 0's choice and its reading of it: a file system slow to show a rename to every node must not split the
    # ranks, and a rank that cannot read what rank 0 read must not leave the others in DCP's collectives.
    chosen = [None, None]
    if rank == 0:
        folder = last_training_state(output_dir)
        chosen = [folder, folder and json.loads((Path(folder) / STATE).read_text())]
    if world > 1:
        dist.broadcast_object_list(chosen, src=0)
    folder, saved = chosen
    if folder is None:
        return 0
    _check_metadata(Path(folder))
    state = _state(model, optimizer, scheduler)
    generators = _rng_state()
    same_ranks = saved["world_size"] == world
    same_generators = saved.get("generators", sorted(generators)) == sorted(generators)
    if same_ranks and same_generators:
        state["rng"] = {f"rank{rank}": generators}
    elif rank == 0:
        why = (
            f"was saved by {saved['world_size']} ranks and is loaded by {world}: the weights and the optimizer are "
            "resharded"
            if not same_ranks
            else f"holds the generators {saved['generators']} and this process has {sorted(generators)}"
        )
        logger.warning(f"{folder} {why}; the random number generators are not restored")
    try:
        with _one_process_is_fine():
            dcp.load(state, checkpoint_id=folder, planner=_WeightsOnlyLoadPlanner())
    except CheckpointException as e:  # DCP gathers every rank's failure: the refusal is the message to give
        refused = [error for error, _ in e.failures.values() if isinstance(error, NotPlainData)]
        if refused:
            raise refused[0] from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=OPTIONS)  # fmt: skip
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    if "rng" in state:
        _set_rng_state(state["rng"][f"rank{rank}"])
    return saved["step"]
