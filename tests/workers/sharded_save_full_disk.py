"""save_pretrained of a sharded Mixtral, every rank calling it, onto a disk too small for it (args["dst"] holds an
earlier save): expert parallelism, FSDP2 and tensor parallelism, the write refused before it starts (the file system
says how full it is) and running out midway (it does not say: `space.free_bytes` answers None, so the kernel's
ENOSPC ends the write); and a save that no rank is to write (`is_main_process=False` everywhere). Each rank records
the error it got, or None."""

from gloo_worker import args, finish, start
from transformers.distributed import DistributedConfig

import fivefold
from fivefold.conversion import space

rank, world = start()
LAYOUTS = {
    "expert parallel": DistributedConfig(ep_size=world, fsdp_size=world),
    "fully sharded": DistributedConfig(fsdp_size=world),
    "tensor parallel": DistributedConfig(tp_size=world),
}
result = {}
free_bytes = space.free_bytes
for name, layout in LAYOUTS.items():
    model = fivefold.FivefoldMixtralForCausalLM.from_pretrained(args["checkpoint"], distributed_config=layout)
    for case in ("refused", "ENOSPC", "not written"):
        space.free_bytes = free_bytes if case == "refused" else (lambda folder: None)
        try:
            model.save_pretrained(args["dst"], is_main_process=case != "not written")
            result[f"{name}, {case}"] = None
        except Exception as error:
            result[f"{name}, {case}"] = f"{type(error).__name__}: {error}"
space.free_bytes = free_bytes
finish(result)
