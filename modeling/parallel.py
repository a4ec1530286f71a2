"""The tensor-parallel style fivefold's plans add to transformers' (configuration/parallel.py holds the plans):
an embedding whose columns are attention heads, T5's relative position bias. Column-wise q/k/v leave each rank
its own heads, so each rank keeps the bias columns of those heads and looks them up locally: the bias then has
the rank's heads, [1, H / N, T, S], as its attention scores do."""

from torch import nn
from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
from transformers.distributed.tensor_parallel import TensorParallelLayer

HEAD_COLUMNS = "fivefold_head_columns"  # the style's name in the plans


class HeadColumns(TensorParallelLayer):
    def should_use_local_tensors(self, module: nn.Module) -> bool:
        return True  # the forward runs on this rank's columns and returns them as they are

    def shard_param(self, module: nn.Module, param: str, mesh, **context) -> None:  # 5.25 passes config, mesh_manager
        from torch.distributed.tensor import Shard, distribute_tensor

        meta = module._parameters.get(param)
        if meta is not None:
            sharded = distribute_tensor(meta, mesh, [Shard(1)], src_data_rank=None)
            module._parameters[param] = nn.Parameter(sharded, requires_grad=meta.requires_grad)


ALL_PARALLEL_STYLES.register(HEAD_COLUMNS, HeadColumns())
