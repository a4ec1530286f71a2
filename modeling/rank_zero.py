"""Work that rank 0 alone does while every rank waits for it (a save): each rank learns how it went from rank 0,
so a failure there raises on every rank, where a barrier after it would keep the others waiting for a rank that had
left it (until the process group's timeout, or for good while rank 0 lived on)."""

from collections.abc import Callable

import torch.distributed as dist


def on_rank_0(
    work: Callable[[], None],
    failed_elsewhere: Callable[[str], BaseException],
    describe: Callable[[BaseException], str] = repr,
) -> None:
    """Runs `work` on rank 0 (alone in a single process) and broadcasts the outcome: rank 0 raises its own error,
    every other rank `failed_elsewhere(describe(error))`."""
    initialized = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if initialized else (0, 1)
    failure = None
    if rank == 0:
        try:
            work()
        except BaseException as error:  # told to every rank, then raised here
            failure = error
    if world > 1:
        outcome = [None if failure is None else describe(failure)]
        dist.broadcast_object_list(outcome, src=0)
        if failure is None and outcome[0] is not None:
            raise failed_elsewhere(outcome[0])
    if failure is not None:
        raise failure
