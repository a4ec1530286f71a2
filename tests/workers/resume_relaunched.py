"""Run by `torchrun --nproc_per_node 2 --max-restarts 6` (gloo): killed training relaunched by torchrun itself, for
DDP (Trainer, fivefold.last_complete_checkpoint), FSDP2 and expert parallelism (a training loop,
fivefold.save_training_state / load_training_state). argv: a converted GPT-2, a converted Mixtral, the output
folder OUT.

Every attempt runs the runs in order, skipping those done (their final weights on disk): first each layout
uninterrupted ("ddp-full", "fsdp2-full", "ep-full"), then each layout killed twice ("ddp", "fsdp2", "ep"). The kills,
by attempt (TORCHELASTIC_RESTART_COUNT), each ending the attempt; torchrun then relaunches the job:
- "step": rank 1 SIGKILLs itself after step 3 (checkpoint-2 saved, checkpoint-4 not yet);
- "save": while checkpoint-4 is being written. DDP: rank 0 after the weights and the optimizer, before the RNG and
  trainer states (Trainer writes in place). FSDP2: rank 0 after every rank's part and DCP's metadata are written,
  before the rename. Expert parallelism: rank 1 after writing its own part, before DCP's metadata.
Each killed rank notes itself in OUT/killed.jsonl. At the start of each run of a killed layout, rank 0 appends to
OUT/attempts.jsonl what the relaunch found: the folders in the run's output folder with their files, and the
checkpoint it resumes from. Each rank saves its final weights (its own shards) to final-<rank>.pt."""

import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from transformers.distributed import DistributedConfig
from transformers.trainer_utils import get_last_checkpoint

import fivefold
from fivefold import training_state

torch.set_num_threads(1)
transformers.utils.logging.set_verbosity_error()
gpt2, mixtral, out = sys.argv[1:4]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
KILLS = {0: ("ddp", "step"), 1: ("ddp", "save"), 2: ("fsdp2", "step"), 3: ("fsdp2", "save"), 4: ("ep", "step"),
         5: ("ep", "save")}  # fmt: skip
STEPS, EVERY = 6, 2
dist.init_process_group("gloo")
rank = dist.get_rank()


def die() -> None:
    """SIGKILL, noted first in OUT/killed.jsonl (torchrun's log names the rank it saw fail first; the other one,
    stopped by gloo's error on the lost connection, may end in the same instant)."""
    with open(Path(out) / "killed.jsonl", "a") as f:
        f.write(json.dumps(dict(attempt=attempt, rank=rank, run=KILLS[attempt][0], kill=KILLS[attempt][1])) + "\n")
    os.kill(os.getpid(), signal.SIGKILL)


def record(run: str, folder: Path, resumed_from: str | None, **extra) -> None:
    if rank != 0:
        return
    found = {p.name: sorted(q.name for q in p.iterdir()) for p in folder.glob("*") if p.is_dir()}
    line = dict(run=run, attempt=attempt, found=found, resumed_from=resumed_from and Path(resumed_from).name)
    if run == "ddp":  # what transformers' own resume_from_checkpoint=True would take
        line["transformers_pick"] = folder.exists() and (pick := get_last_checkpoint(folder)) and Path(pick).name
    with open(Path(out) / "attempts.jsonl", "a") as f:
        f.write(json.dumps(line | extra) + "\n")


def batch(step: int) -> torch.Tensor:
    """This rank's batch of `step`: the data order is a function of the step."""
    return torch.randint(3, 99, (2, 8), generator=torch.Generator().manual_seed(100 * step + rank))


def trainer_run(run: str, folder: Path, kill: str | None) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(gpt2)  # dropout on
    ids = torch.randint(3, 99, (12, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": i} for i in ids]

    class Kill(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if kill == "step" and state.global_step == 3 and rank == 1:
                die()

    class KilledMidSave(transformers.Trainer):
        def _save_rng_state(self, output_dir):
            if kill == "save" and self.state.global_step == 4 and rank == 0:
                die()
            super()._save_rng_state(output_dir)

    args = transformers.TrainingArguments(
        output_dir=str(folder), max_steps=STEPS, save_steps=EVERY, per_device_train_batch_size=2, learning_rate=1e-2,
        lr_scheduler_type="linear", warmup_steps=2, report_to=[], use_cpu=True, seed=0, data_seed=0,
        disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = KilledMidSave(model=model, args=args, train_dataset=data, callbacks=[Kill()])
    start = fivefold.last_complete_checkpoint(folder)
    if run == "ddp":
        record(run, folder, start)
    trainer.train(resume_from_checkpoint=start)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, folder / f"final-{rank}.pt")


def loop_run(run: str, folder: Path, kill: str | None) -> None:
    """A training loop of its own over FSDP2 (GPT-2, dropout on) or expert parallelism (Mixtral, router jitter
    noise and the auxiliary loss on): AdamW with weight decay off for norms and biases (two param groups), a
    schedule, a checkpoint every EVERY steps, the last 2 kept."""
    if run.startswith("fsdp2"):
        path, layout, extra = gpt2, DistributedConfig(fsdp_size=2), {}
    else:
        path, layout = mixtral, DistributedConfig(ep_size=2, fsdp_size=2)
        extra = dict(router_jitter_noise=0.2, output_router_logits=True, router_aux_loss_coef=0.5)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, distributed_config=layout, **extra).train()
    torch.manual_seed(rank)  # dropout and jitter draw from here: the same start in every run of a layout
    groups = [[p for p in model.parameters() if (p.dim() > 1) == decayed] for decayed in (True, False)]
    optimizer = torch.optim.AdamW([{"params": groups[0]}, {"params": groups[1], "weight_decay": 0.0}], lr=1e-2)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 2) * (1 - s / STEPS))
    if kill == "save" and run == "fsdp2":
        put_in_place = training_state._put_in_place
        training_state._put_in_place = lambda partial, final: die() if rank == 0 else put_in_place(partial, final)
    if kill == "save" and run == "ep":
        write = FileSystemWriter.write_data

        def write_then_die(self, plan, planner):
            written = write(self, plan, planner)
            written.wait()
            if rank == 1 and "checkpoint-4" in str(self.path):
                die()
            return written

        FileSystemWriter.write_data = write_then_die
    step = fivefold.load_training_state(folder, model, optimizer, schedule)
    if step == 0:  # the weights before training: the test checks that they moved
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(local_weights(model), folder / f"initial-{rank}.pt")
    if run in ("fsdp2", "ep"):
        record(run, folder, fivefold.last_training_state(folder), step=step)
    while step < STEPS:
        ids = batch(step)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        step += 1
        if kill == "step" and step == 3 and rank == 1:
            die()
        if step % EVERY == 0:
            fivefold.save_training_state(folder, step, model, optimizer, schedule, keep=2)
    torch.save(local_weights(model), folder / f"final-{rank}.pt")


def local_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's own shards: its FSDP2 shards, its experts."""
    return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone() for k, v in model.state_dict().items()}


for run in ("ddp-full", "fsdp2-full", "ep-full", "ddp", "fsdp2", "ep"):
    folder = Path(out) / run
    if all((folder / f"final-{r}.pt").exists() for r in range(dist.get_world_size())):
        continue
    kill = KILLS.get(attempt, (None, None))[1] if KILLS.get(attempt, (None,))[0] == run else None
    (trainer_run if run.startswith("ddp") else loop_run)(run, folder, kill)
    dist.barrier()
dist.destroy_process_group()
