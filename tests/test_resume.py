"""A training job killed between two checkpoints resumes exactly: Trainer on a converted BERT, GPT-2 and Mixtral
(router jitter noise on, the auxiliary loss on, dropout on) is killed with SIGKILL after checkpoint 2 and before
checkpoint 4, resumed with `resume_from_checkpoint`, and ends with the uninterrupted run's weights bit for bit
(fp32, one process, the same thread count: Trainer's checkpoint holds the optimizer, scheduler, the RNG states and
the data order)."""

import json
import os
import pickle
import re
import shutil
import signal
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from launching import WORKERS, environment, python, side_by_side, torchrun

import fivefold

# One run: "full" trains 6 steps, "killed" SIGKILLs itself at step 3 (checkpoint-2 on disk, not checkpoint-4),
# "resume" continues from the last checkpoint. Saves the final weights to OUT/final.pt. argv: MODE FOLDER KIND OUT.
JOB = textwrap.dedent(
    """
    import os, signal, sys
    import torch, transformers
    import fivefold

    torch.set_num_threads(1)
    mode, folder, kind, out = sys.argv[1:5]
    overrides = {"mixtral": dict(router_jitter_noise=0.2, output_router_logits=True, router_aux_loss_coef=0.5)}
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
    """
)
CASES = [("bert", "BertForMaskedLM"), ("gpt2", "GPT2LMHeadModel"), ("mixtral", "MixtralForCausalLM")]


def _runs(runs: dict[tuple[str, str], list]) -> dict[tuple[str, str], tuple[int, str]]:
    """Each run (MODE, FOLDER, KIND, OUT) a child of the warm interpreter (tests/launching.py), all at once: its exit
    code and standard error."""
    commands = {name: [*python(warmed=True), "-c", JOB, *(str(a) for a in args)] for name, args in runs.items()}
    return {name: (done.returncode, done.stderr) for name, done in side_by_side(commands, environment(), 300).items()}


@pytest.mark.slow
def test_killed_training_resumes_to_the_uninterrupted_weights(converted, tmp_path):
    folders = {kind: converted(kind, cls)[1] for kind, cls in CASES}
    runs = {(kind, mode): [mode, folders[kind], kind, tmp_path / f"{kind}-{mode}"] for kind in folders
            for mode in ("full", "killed")}  # fmt: skip
    for (kind, mode), (code, err) in _runs(runs).items():
        expected = -signal.SIGKILL if mode == "killed" else 0
        assert code == expected, f"{kind} {mode}: {err[-3000:]}"
    for kind in folders:
        killed = tmp_path / f"{kind}-killed"
        assert sorted(p.name for p in killed.glob("checkpoint-*")) == ["checkpoint-2"]  # between 2 and 4
        assert not (killed / "final.pt").exists()
    resumed = _runs(
        {(kind, "resume"): ["resume", folders[kind], kind, tmp_path / f"{kind}-killed"] for kind in folders}
    )
    for (kind, _), (code, err) in resumed.items():
        assert code == 0, f"{kind} resume: {err[-3000:]}"
    for kind in folders:
        full = torch.load(tmp_path / f"{kind}-full" / "final.pt")
        again = torch.load(tmp_path / f"{kind}-killed" / "final.pt")
        assert full.keys() == again.keys()
        differing = [k for k in full if not torch.equal(full[k], again[k])]
        assert differing == [], f"{kind}: {len(differing)} tensors differ, e.g. {differing[:3]}"


# What each relaunch found (tests/workers/resume_relaunched.py): the attempt, the run, the folders of the run's output
# folder with their files, the checkpoint it resumed from.
DCP = [".metadata", "__0_0.distcp", "__1_0.distcp", "training_state.json"]
EXPECTED_ATTEMPTS = [
    (0, "ddp", [], None),
    (1, "ddp", ["checkpoint-2"], "checkpoint-2"),
    (2, "ddp", ["checkpoint-2", "checkpoint-4"], "checkpoint-2"),  # checkpoint-4 half-written, in place
    (2, "fsdp2", [], None),
    (3, "fsdp2", ["checkpoint-2"], "checkpoint-2"),
    (4, "fsdp2", [".checkpoint-4.partial", "checkpoint-2"], "checkpoint-2"),  # whole, but never made visible
    (4, "ep", [], None),
    (5, "ep", ["checkpoint-2"], "checkpoint-2"),
    (6, "ep", [".checkpoint-4.partial", "checkpoint-2"], "checkpoint-2"),  # rank 1's part only: no metadata
]
KILLED = [(1, "step", "ddp"), (0, "save", "ddp"), (1, "step", "fsdp2"), (0, "save", "fsdp2"), (1, "step", "ep"),
          (1, "save", "ep")]  # fmt: skip


@pytest.mark.slow
def test_killed_training_relaunched_by_torchrun_resumes_exactly(converted, tmp_path):
    """`torchrun --nproc_per_node 2 --max-restarts 6` (gloo) over DDP with Trainer, FSDP2 and expert parallelism
    with a training loop and fivefold.save_training_state: each layout runs once uninterrupted, then once killed
    twice, each kill ending an attempt and torchrun relaunching the job: rank 1 SIGKILLed after step 3, then a rank
    SIGKILLed while checkpoint-4 is being written (DDP: Trainer's in-place checkpoint-4 left without its RNG and
    trainer states; FSDP2: every part and DCP's metadata written, before the rename; expert parallelism: rank 1's
    part written, no metadata). Every relaunch resumes from checkpoint-2 and every killed run ends with its
    uninterrupted run's weights on both ranks, bit for bit. transformers' own resume_from_checkpoint=True would have
    taken the half-written checkpoint-4; the sharded checkpoints are visible only when complete."""
    gpt2, mixtral = converted("gpt2", "GPT2LMHeadModel")[1], converted("mixtral", "MixtralForCausalLM")[1]
    script = [str(WORKERS / "resume_relaunched.py"), str(gpt2), str(mixtral), str(tmp_path)]
    log = torchrun(script, 2, tmp_path, timeout=420, restarts=6, warmed=True)
    killed = [json.loads(line) for line in (tmp_path / "killed.jsonl").read_text().splitlines()]
    assert [(k["attempt"], k["rank"], k["kill"], k["run"]) for k in killed] == [(i, *k) for i, k in enumerate(KILLED)]
    assert len(re.findall(r"failed \(exitcode: -?\d+\) local_rank", log)) == len(KILLED), log[-6000:]  # relaunched
    attempts = [json.loads(line) for line in (tmp_path / "attempts.jsonl").read_text().splitlines()]
    seen = [(a["attempt"], a["run"], sorted(a["found"]), a["resumed_from"]) for a in attempts]
    assert seen == EXPECTED_ATTEMPTS, seen
    ddp_half = attempts[2]
    assert "optimizer.pt" in ddp_half["found"]["checkpoint-4"] and "trainer_state.json" not in ddp_half["found"][
        "checkpoint-4"] and ddp_half["transformers_pick"] == "checkpoint-4"  # fmt: skip
    assert attempts[5]["found"][".checkpoint-4.partial"] == DCP  # complete, yet not taken: it was never renamed
    assert ".metadata" not in attempts[8]["found"][".checkpoint-4.partial"]
    for layout in ("fsdp2", "ep"):
        assert sorted(p.name for p in (tmp_path / layout).glob("*checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    for layout in ("ddp", "fsdp2", "ep"):
        for rank in (0, 1):
            full = torch.load(tmp_path / f"{layout}-full" / f"final-{rank}.pt")
            resumed = torch.load(tmp_path / layout / f"final-{rank}.pt")
            differing = [k for k in full if not torch.equal(full[k], resumed[k])]
            assert full.keys() == resumed.keys() and differing == [], f"{layout} rank {rank}: {differing}"
            if layout != "ddp":
                initial = torch.load(tmp_path / layout / f"initial-{rank}.pt")
                assert any(not torch.equal(initial[k], full[k]) for k in full)  # it trained


def _trained(folder, steps: range, state_dir, save_at: int | None = None, resume: bool = False) -> dict:
    """A converted GPT-2 (dropout on) trained in this process with AdamW and a schedule, one step per element of
    `steps`, saved with fivefold.save_training_state after step `save_at`; or first resumed from `state_dir`."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (s + 1))
    if resume:
        assert fivefold.load_training_state(state_dir, model, optimizer, schedule) == steps.start
    for step in steps:
        ids = torch.randint(3, 99, (2, 8), generator=torch.Generator().manual_seed(step))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step(), schedule.step(), optimizer.zero_grad()
        if step + 1 == save_at:
            fivefold.save_training_state(state_dir, save_at, model, optimizer, schedule, keep=1)
    return {"weights": model.state_dict(), "next_draw": torch.rand(3), "lr": schedule.get_last_lr()}


def test_a_partial_training_state_is_never_loaded_and_the_next_save_removes_it(converted, tmp_path):
    """One process, no process group: a training state saved after step 2 and loaded into a fresh model, optimizer
    and schedule continues exactly as the run that saved it (weights, learning rate, the next random draw). A
    checkpoint-4 left partial by a killed save, even one complete but for its rename, is never taken; the next save
    removes it, and `keep=1` leaves only the newest checkpoint."""
    folder = converted("gpt2", "GPT2LMHeadModel")[1]
    state = tmp_path / "state"
    assert fivefold.load_training_state(state, torch.nn.Linear(1, 1), None) == 0  # nothing saved yet: untouched
    fivefold.save_training_state(state, 1, *_bare_training(folder))
    full = _trained(folder, range(4), state, save_at=2)
    assert sorted(p.name for p in state.iterdir()) == ["checkpoint-2"]  # keep=1: checkpoint-1 removed
    partial = state / ".checkpoint-4.partial"
    shutil.copytree(state / "checkpoint-2", partial)  # every file there, yet never renamed
    assert fivefold.last_training_state(state) == str(state / "checkpoint-2")
    resumed = _trained(folder, range(2, 4), state, resume=True)
    assert all(torch.equal(full["weights"][k], resumed["weights"][k]) for k in full["weights"])
    assert torch.equal(full["next_draw"], resumed["next_draw"]) and full["lr"] == resumed["lr"]
    fivefold.save_training_state(state, 4, *_bare_training(folder), keep=1)
    assert sorted(p.name for p in state.iterdir()) == ["checkpoint-4"]  # the partial folder removed


def _bare_training(folder) -> tuple:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return model, torch.optim.AdamW(model.parameters())


class _Payload:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["FIVEFOLD_TEST_MARKER"]),))


class _SchedulerWithAnObject:
    def state_dict(self) -> dict:
        return {"last_epoch": 2, "hook": _Payload()}

    def load_state_dict(self, state: dict) -> None:
        raise AssertionError("never reached")


def test_a_training_state_holding_code_is_refused(converted, tmp_path, monkeypatch):
    """DCP keeps non-tensor values as pickles and would unpickle them with weights_only=False, and reads its
    `.metadata` with a plain pickle.load: a value, or a metadata file, that runs code when unpickled (here it would
    create a file) is refused, naming it, and never runs."""
    marker = tmp_path / "ran"
    monkeypatch.setenv("FIVEFOLD_TEST_MARKER", str(marker))
    model, optimizer = _bare_training(converted("gpt2", "GPT2LMHeadModel")[1])
    fivefold.save_training_state(tmp_path / "state", 2, model, optimizer, _SchedulerWithAnObject())
    with pytest.raises(ValueError, match=r"'scheduler\.hook' in the training state is not plain data"):
        fivefold.load_training_state(tmp_path / "state", model, optimizer, _SchedulerWithAnObject())
    fivefold.save_training_state(tmp_path / "crafted", 2, model, optimizer)
    (tmp_path / "crafted" / "checkpoint-2" / ".metadata").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(ValueError, match=r"\.metadata names pathlib\.Path\.touch, which a checkpoint's metadata"):
        fivefold.load_training_state(tmp_path / "crafted", model, optimizer)
    assert not marker.exists()
