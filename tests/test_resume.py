"""A training job killed between two checkpoints resumes exactly: Trainer on a converted BERT, GPT-2 and Mixtral
(router jitter noise on, the auxiliary loss on, dropout on) is killed with SIGKILL after checkpoint 2 and before
checkpoint 4, resumed with `resume_from_checkpoint`, and ends with the uninterrupted run's weights bit for bit
(fp32, one process, the same thread count: Trainer's checkpoint holds the optimizer, scheduler, the RNG states and
the data order)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from launching import WORKERS, free_port

# One run of the job: "full" trains 6 steps, "killed" SIGKILLs itself at step 3 (checkpoint-2 on disk, not
# checkpoint-4), "resume" continues from the last checkpoint. Saves the final weights to OUT/final.pt.
JOB = textwrap.dedent(
    """
    import os, signal, sys
    import torch, transformers
    import fivefold

    torch.set_num_threads(min(2, torch.get_num_threads()))
    mode = sys.argv[1]
    overrides = {"mixtral": dict(router_jitter_noise=0.2, output_router_logits=True, router_aux_loss_coef=0.5)}
    def run(folder, kind, out):
        model = transformers.AutoModelForMaskedLM.from_pretrained(folder) if kind == "bert" else (
            transformers.AutoModelForCausalLM.from_pretrained(folder, **overrides.get(kind, {})))
        model.train()
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(4, model.config.vocab_size, (32, 10), generator=gen)
        labels = ids.masked_fill(torch.rand(ids.shape, generator=gen) < 0.5, -100) if kind == "bert" else ids
        data = [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": l} for i, l in zip(ids, labels)]

        class KillAtStep3(transformers.TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == 3:
                    os.kill(os.getpid(), signal.SIGKILL)

        args = transformers.TrainingArguments(
            output_dir=out, max_steps=6, save_steps=2, per_device_train_batch_size=4, learning_rate=1e-2,
            lr_scheduler_type="linear", warmup_steps=2, report_to=[], use_cpu=True, seed=0, data_seed=0,
            disable_tqdm=True, dataloader_num_workers=0, save_only_model=False,
        )
        callbacks = [KillAtStep3()] if mode == "killed" else []
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
        trainer.train(resume_from_checkpoint=True if mode == "resume" else None)
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, os.path.join(out, "final.pt"))

    # Each job is (folder, kind, out) triples; a killed job dies in its first.
    for folder, kind, out in zip(*[iter(sys.argv[2:])] * 3):
        run(folder, kind, out)
    """
)
CASES = [("bert", "BertForMaskedLM"), ("gpt2", "GPT2LMHeadModel"), ("mixtral", "MixtralForCausalLM")]


def _job(script, mode, runs) -> subprocess.Popen:
    """One interpreter for several runs (folder, kind, out): the import of transformers is paid once."""
    args = [sys.executable, "-c", script, mode, *(str(x) for run in runs for x in run)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_killed_training_resumes_to_the_uninterrupted_weights(converted, tmp_path):
    folders = {kind: converted(kind, cls)[1] for kind, cls in CASES}
    # The uninterrupted runs in one interpreter, and each killed run in its own (it dies), all at once.
    jobs = {("all", "full"): _job(JOB, "full", [(folders[k], k, tmp_path / f"{k}-full") for k in folders])}
    jobs |= {(kind, "killed"): _job(JOB, "killed", [(folders[kind], kind, tmp_path / f"{kind}-killed")])
             for kind in folders}  # fmt: skip
    for (kind, mode), job in jobs.items():
        _, err = job.communicate(timeout=900)
        expected = -signal.SIGKILL if mode == "killed" else 0
        assert job.returncode == expected, f"{kind} {mode}: {err[-3000:]}"
    for kind in folders:
        killed = tmp_path / f"{kind}-killed"
        assert sorted(p.name for p in killed.glob("checkpoint-*")) == ["checkpoint-2"]  # between 2 and 4
        assert not (killed / "final.pt").exists()
    resumed = _job(JOB, "resume", [(folders[k], k, tmp_path / f"{k}-killed") for k in folders])
    _, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, f"resume: {err[-3000:]}"
    for kind in folders:
        full = torch.load(tmp_path / f"{kind}-full" / "final.pt")
        again = torch.load(tmp_path / f"{kind}-killed" / "final.pt")
        assert full.keys() == again.keys()
        differing = [k for k in full if not torch.equal(full[k], again[k])]
        assert differing == [], f"{kind}: {len(differing)} tensors differ, e.g. {differing[:3]}"


def _torchrun_jobs(runs: dict[str, list[str]], cwd, timeout: float = 400) -> dict[str, tuple[int, str]]:
    """Each run as `torchrun --nproc_per_node=2 resume_ddp.py ARGS`, side by side: its exit code and output; a
    hang kills every job's process group and fails the test."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(WORKERS)}
    jobs = {}
    for name, args in runs.items():
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
        jobs[name] = subprocess.Popen(
            [*command, str(WORKERS / "resume_ddp.py"), *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
    deadline, done = time.time() + timeout, {}
    for name, job in jobs.items():
        try:
            out, _ = job.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for other in jobs.values():
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            pytest.fail(f"{name}: timed out (a hang)")
        done[name] = (job.returncode, out)
    return done


@pytest.mark.slow
def test_killed_ddp_training_relaunched_under_torchrun_resumes_exactly(converted, tmp_path):
    """Two gloo ranks: one run straight through; one whose rank 1 is SIGKILLed at step 3 (torchrun ends the job);
    one whose rank 0 is SIGKILLed while writing checkpoint-4, which is left without its RNG and trainer states.
    Each killed job relaunched from `fivefold.last_complete_checkpoint` ends with the uninterrupted run's weights,
    bit for bit; transformers' own `resume_from_checkpoint=True` would have taken the half-written checkpoint-4."""
    folder = converted("gpt2", "GPT2LMHeadModel")[1]
    out = {name: tmp_path / name for name in ("full", "kill-rank-1", "kill-mid-save")}
    first = _torchrun_jobs({name: [str(folder), str(path), name] for name, path in out.items()}, tmp_path)
    assert first["full"][0] == 0, first["full"][1][-4000:]
    for name in ("kill-rank-1", "kill-mid-save"):
        code, log = first[name]
        assert code != 0 and "Signal 9 (SIGKILL)" in log, log[-4000:]
        assert not (out[name] / "final.pt").exists()
    assert sorted(p.name for p in out["kill-rank-1"].glob("checkpoint-*")) == ["checkpoint-2"]
    half = out["kill-mid-save"] / "checkpoint-4"
    assert (half / "optimizer.pt").is_file() and not (half / "trainer_state.json").exists()  # half-written
    again = _torchrun_jobs({name: [str(folder), str(out[name]), "resume"] for name in ("kill-rank-1", "kill-mid-save")},
                           tmp_path)  # fmt: skip
    full = torch.load(out["full"] / "final.pt")
    for name, (code, log) in again.items():
        assert code == 0, log[-4000:]
        resumed_from = json.loads((out[name] / "resumed-from.json").read_text())
        assert Path(resumed_from["fivefold"]).name == "checkpoint-2", resumed_from
        resumed = torch.load(out[name] / "final.pt")
        differing = [k for k in full if not torch.equal(full[k], resumed[k])]
        assert full.keys() == resumed.keys() and differing == [], f"{name}: {len(differing)} tensors differ"
    assert Path(json.loads((out["kill-mid-save"] / "resumed-from.json").read_text())["transformers"]) == half
