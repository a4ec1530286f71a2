"""Run by torchrun (2 processes, gloo): Trainer on a converted GPT-2 (dropout on) trains 6 steps, a checkpoint every
2. MODE "full" runs straight through; "kill-rank-1": rank 1 SIGKILLs itself at step 3 (checkpoint-2 complete on
disk); "kill-mid-save": rank 0 SIGKILLs itself while writing checkpoint-4, after its weights and optimizer and
before the RNG and trainer states; "resume" continues from fivefold.last_complete_checkpoint(OUT) and says which
checkpoint that was and which one transformers' own `resume_from_checkpoint=True` would have taken. Rank 0 saves
the final weights to OUT/final.pt."""

import json
import os
import signal
import sys

import torch
import transformers
from transformers.trainer_utils import get_last_checkpoint

import fivefold

torch.set_num_threads(1)
transformers.utils.logging.set_verbosity_error()
folder, out, mode = sys.argv[1:4]
rank = int(os.environ["RANK"])
model = transformers.AutoModelForCausalLM.from_pretrained(folder)
gen = torch.Generator().manual_seed(0)
ids = torch.randint(4, model.config.vocab_size, (24, 10), generator=gen)
data = [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": i} for i in ids]


class KillRank1AtStep3(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)


class KilledMidSave(transformers.Trainer):
    def _save_rng_state(self, output_dir):
        if self.state.global_step == 4 and rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        super()._save_rng_state(output_dir)


args = transformers.TrainingArguments(
    output_dir=out, max_steps=6, save_steps=2, per_device_train_batch_size=2, learning_rate=1e-2,
    lr_scheduler_type="linear", warmup_steps=2, report_to=[], use_cpu=True, seed=0, data_seed=0,
    disable_tqdm=True, dataloader_num_workers=0,
)  # fmt: skip
cls = KilledMidSave if mode == "kill-mid-save" else transformers.Trainer
callbacks = [KillRank1AtStep3()] if mode == "kill-rank-1" else []
trainer = cls(model=model, args=args, train_dataset=data, callbacks=callbacks)
start = fivefold.last_complete_checkpoint(out) if mode == "resume" else None
if mode == "resume" and rank == 0:
    with open(os.path.join(out, "resumed-from.json"), "w") as f:
        json.dump({"fivefold": start, "transformers": get_last_checkpoint(out)}, f)
trainer.train(resume_from_checkpoint=start)
if rank == 0:
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, os.path.join(out, "final.pt"))
