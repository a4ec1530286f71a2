"""Expert parallelism: the experts of every mixture-of-experts layer split over the ranks of a process group, each
token sent to the rank owning its expert with all-to-all, and back.

Rank r of N holds the contiguous block of experts [r * E / N, (r + 1) * E / N); the others are `RemoteExpert`s,
which hold no weights, so the checkpoint names of the experts (`experts.{e}.*`, global e) do not change and loading
reads only this rank's experts. Every rank runs its own batch: it routes its tokens, sends each (token, expert)
assignment to the expert's owner, runs its own experts on what arrives (every expert, on zero rows if need be,
so that the backward exchange happens on every rank), and sends the outputs back, where they are combined exactly
as on one device. Both exchanges are autograd-aware: the backward pass sends the gradients the other way.

`from_pretrained(..., distributed_config=DistributedConfig(ep_size=N, fsdp_size=N))` reaches `distribute` below;
the layers outside the experts are then sharded with FSDP2 (`fully_shard`) over the same ranks. With
`DistributedConfig(ep_size=N, tp_size=N)` the ranks share one batch and tensor parallelism splits the rest.
A quantized model keeps the rest whole on every rank instead (neither shards quantized weights), for inference.

Shapes: N tokens, C channels, E experts, R experts per token, A assignments, G ranks of a process group,
X experts one rank holds (E / G, expert parallelism).
"""

import re

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_autograd
from torch import nn

from .moe import MixtureOfExperts, run_experts


class RemoteExpert(nn.Module):
    """An expert another rank holds: no weights here."""

    def __init__(self, owner: int):
        super().__init__()
        self.owner = owner

    def extra_repr(self) -> str:
        return f"on rank {self.owner}"


def _exchange(x: torch.Tensor, send: list[int], receive: list[int], group) -> torch.Tensor:
    """All-to-all of rows: send[i] rows of x (in order) to rank i, receive[i] rows from rank i. Autograd-aware."""
    out = x.new_empty(sum(receive), *x.shape[1:])
    if torch.is_grad_enabled() and x.requires_grad:
        return dist_autograd.all_to_all_single(out, x.contiguous(), receive, send, group=group)
    dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)
    return out


class ExpertParallelMixtureOfExperts(MixtureOfExperts):
    """A `MixtureOfExperts` whose experts are split over `group` (see the module docstring)."""

    group = None
    first: int = 0  # the first expert this rank holds
    local: int = 0  # how many it holds (X)
    batches: int = 1  # the ranks whose tokens an expert's gradient sums; it is divided by this
    # Set for a quantized model, whose layers outside the experts are copies on every rank that nothing keeps equal
    # under training: a backward pass through the layer is refused.
    inference_only: bool = False

    def divide_gradients(self) -> None:
        """Once per weight (loading replaces the weights built on meta, so this waits for the first forward)."""
        for p in self.experts[self.first : self.first + self.local].parameters():
            if p.requires_grad and not getattr(p, "_divided_by_batches", False):
                p.register_hook(lambda grad, n=self.batches: grad / n)
                p._divided_by_batches = True

    def dispatch(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x: [N, C], weights/experts: [N, R] -> [N, C], as `MixtureOfExperts.dispatch` on one device."""
        world, local = dist.get_world_size(self.group), self.local
        if torch.is_grad_enabled():
            self.divide_gradients()
        flat = experts.reshape(-1)  # [A]
        order = flat.argsort(stable=True)  # [A], grouped by expert, hence by owning rank
        token = order // self.top_k  # [A]
        counts = torch.bincount(flat, minlength=world * local)  # [E]
        arriving = torch.empty_like(counts)  # [G * X]: from each rank, its count for each of our experts
        dist.all_to_all_single(arriving, counts, group=self.group)
        arriving = arriving.view(world, local)  # [G, X]
        send, receive = counts.view(world, local).sum(1).tolist(), arriving.sum(1).tolist()
        rows = _exchange(x[token], send, receive, self.group)  # [sum(receive), C], by source rank, then expert
        # Regroup the arrived rows by our expert, run them, and put the outputs back in arrival order.
        expert_of_row = torch.arange(local, device=x.device).repeat(world).repeat_interleave(arriving.flatten())
        by_expert = expert_of_row.argsort(stable=True)
        local_experts = self.experts[self.first : self.first + local]
        out = run_experts(local_experts, rows[by_expert], arriving.sum(0).tolist())  # [sum(receive), C]
        out = torch.zeros_like(out).index_copy(0, by_expert, out)
        y = _exchange(out, receive, send, self.group) * weights.reshape(-1)[order, None]  # [A, C]
        combined = torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))
        if self.inference_only and combined.requires_grad:
            combined.register_hook(_refuse_training)  # before the backward's exchanges, which every rank would enter
        return combined


def _refuse_training(grad: torch.Tensor) -> None:
    raise RuntimeError(
        "a quantized model under expert parallelism runs inference only: its layers outside the experts are whole "
        "copies on every rank, which nothing keeps equal under training"
    )


def partition_experts(moe: MixtureOfExperts, group) -> None:
    """Keeps this rank's block of `moe`'s experts, in place; the others become `RemoteExpert`s."""
    num_experts, world = len(moe.experts), dist.get_world_size(group)
    if num_experts % world:
        raise ValueError(
            f"expert parallelism over {world} ranks needs a number of experts divisible by {world}; "
            f"this layer has {num_experts}"
        )
    local = num_experts // world
    first = dist.get_rank(group) * local
    for e in range(num_experts):
        if not first <= e < first + local:
            moe.experts[e] = RemoteExpert(e // local)
    moe.__class__ = ExpertParallelMixtureOfExperts
    moe.group, moe.first, moe.local = group, first, local


def expert_layers(model: nn.Module) -> list[MixtureOfExperts]:
    return [m for m in model.modules() if isinstance(m, MixtureOfExperts)]


def local_expert_parameters(model: nn.Module) -> set[nn.Parameter]:
    return {p for moe in expert_layers(model) for expert in moe.experts for p in expert.parameters()}


def distribute(model: nn.Module, distributed_config, mesh_manager) -> nn.Module:
    """Expert parallelism over the `ep` ranks, before the weights load, in one of two layouts:
    - `ep_size == fsdp_size`: every rank runs its own batch, and FSDP2 shards the rest of the model. Stock's FSDP
      would shard this rank's experts as if every rank held the same ones, so they are kept out of it
      (`ignored_params`): each lives whole on one rank.
    - `ep_size == tp_size`: the ranks share one batch, and tensor parallelism splits the rest. Each rank still
      sends each assignment only to its expert's owner, so every expert runs once per copy of the batch.
    Either way an expert's gradient sums what every rank of the group sent it, and is divided by their number:
    the mean over the batches, as FSDP averages, or one copy of the shared batch."""
    config = distributed_config
    if (
        config.pp_size > 1
        or config.dp_replicate_size > 1
        or config.efsdp_size != 1
        or min(config.tp_size, config.dp_size) > 1
    ):
        raise NotImplementedError(
            "fivefold's expert parallelism takes ep_size == fsdp_size or ep_size == tp_size "
            f"(asked: ep {config.ep_size}, fsdp {config.fsdp_size}, tp {config.tp_size}, pp {config.pp_size}, "
            f"dp_replicate {config.dp_replicate_size})"
        )
    model.config.distributed_config = config
    model._mesh_manager = mesh_manager
    model._device_mesh = mesh_manager.get_mesh(("pp", "fsdp", "tp"))
    model._is_distributed_loading_by_transformers = True
    model._tp_size, model._fsdp_size = config.tp_size, config.fsdp_size
    model.expert_group = group = mesh_manager.get_mesh("ep").get_group()
    for name, moe in model.named_modules():
        if isinstance(moe, MixtureOfExperts):
            partition_experts(moe, group)
            moe.batches = config.ep_size
            # The other ranks' experts are in the checkpoint and deliberately not read: not "unexpected".
            remote = "|".join(str(e) for e, expert in enumerate(moe.experts) if isinstance(expert, RemoteExpert))
            model._keys_to_ignore_on_load_unexpected.add(rf"^{re.escape(name)}\.experts\.({remote})\.")
    if getattr(model, "is_quantized", False):  # set by the quantizer before this, for a saved quantized folder too
        # FSDP2 and tensor parallelism shard plain tensors, not torchao's or bitsandbytes' quantized weights: the
        # layers outside the experts stay whole on every rank, and the model runs inference only.
        for moe in expert_layers(model):
            moe.inference_only = True
        model._tp_size, model._fsdp_size, model._tp_plan = 1, 1, {}  # what transformers reads as sharded: nothing
        if config.fsdp_size > 1:  # every rank its own batch: the load-balancing loss counts them all, as below
            model.data_parallel_group = mesh_manager.get_mesh("fsdp").get_group()
        model._is_fsdp_managed_module = True  # generate() syncs the ranks: each step's tokens travel to the experts
        return model
    if config.tp_size > 1:
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism

        model._tp_plan = {rule: style for rule, style in model.tp_plan.items() if ".experts." not in rule}
        apply_tensor_parallelism(model, mesh_manager.get_mesh("tp"), model._expand_parallel_plan(model._tp_plan))
        return model  # one batch: the load-balancing loss is this rank's
    from torch.distributed.fsdp import fully_shard

    model.data_parallel_group = mesh_manager.get_mesh("fsdp").get_group()
    experts = local_expert_parameters(model)
    fsdp_mesh = mesh_manager.get_mesh("fsdp")
    for block in model.base_model.layers:
        fully_shard(block, mesh=fsdp_mesh, ignored_params=experts)
    fully_shard(model, mesh=fsdp_mesh, ignored_params=experts)
    model._is_fsdp_managed_module = True  # generate() then syncs the ranks (synced_gpus)
    return model


def gather_experts(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Adds every rank's experts to the full state dict rank 0 writes (other ranks get {})."""
    group = model.expert_group
    local = {
        name: tensor.detach().cpu()
        for name, tensor in model.state_dict().items()
        if ".experts." in name and not hasattr(tensor, "device_mesh")
    }
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, local, group=group)
    if dist.get_rank() != 0:
        return {}
    for part in every:
        state_dict.update(part)
    return state_dict
