"""Fine-tuning through Trainer, on text (a converted BERT classifier) and on real images (a converted ViT on
scikit-learn's handwritten digits, 8 x 8 resized to 32 x 32): the loss goes down, gradient accumulation 2 x 2 gives
the update of one batch of 4, and the trained model survives save_pretrained -> from_pretrained."""

import pytest
import torch
import transformers
from torch.nn import functional as F
from torch.utils.data import Dataset

import fivefold


class TinyTask(Dataset):
    """Ragged padded sequences; the label says whether token 7 occurs (so there is something to learn)."""

    def __init__(self, n: int, vocab: int, length: int = 12, regression: bool = False, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(8, vocab, (n, length), generator=gen)
        self.ids[::2, 3] = 7
        lengths = torch.randint(4, length + 1, (n,), generator=gen)
        self.mask = (torch.arange(length)[None] < lengths[:, None]).long()
        self.ids = self.ids.masked_fill(self.mask == 0, 0)
        has = (self.ids == 7).any(1)
        self.labels = has.float() * 2 - 1 if regression else has.long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def _model(converted, num_labels: int):
    _, dst = converted("bert", "BertForSequenceClassification")
    torch.manual_seed(0)  # a head of another size is new, drawn at random: the same one for every model built here
    return transformers.AutoModelForSequenceClassification.from_pretrained(
        dst,
        num_labels=num_labels,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        ignore_mismatched_sizes=True,
    )


def _args(tmp_path, **kw) -> transformers.TrainingArguments:
    defaults = dict(
        output_dir=str(tmp_path / "out"),
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        data_seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return transformers.TrainingArguments(**{**defaults, **kw})


@pytest.mark.slow
def test_fine_tuning_lowers_the_loss_and_round_trips(converted, tmp_path):
    model = _model(converted, 2)
    data = TinyTask(32, model.config.vocab_size)
    args = _args(tmp_path, per_device_train_batch_size=8, max_steps=40, learning_rate=3e-3, logging_steps=4)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    assert trainer.model_accepts_loss_kwargs  # our forward takes **kwargs and normalises by num_items_in_batch
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses[-1] < 0.5 * losses[0], losses

    model.eval()
    model.save_pretrained(tmp_path / "trained")
    again = fivefold.FivefoldBertForSequenceClassification.from_pretrained(tmp_path / "trained").eval()
    batch = data[:4]
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, again(**batch).logits)


def one_sgd_update(model, data, tmp_path, batch_size: int, accumulation: int) -> dict[str, torch.Tensor]:
    """The parameter change of one optimizer step (plain SGD, no clipping) over `data`."""
    args = _args(
        tmp_path,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=0.5,
        optim="sgd",
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
    )
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    transformers.Trainer(model=model, args=args, train_dataset=data).train()
    return {k: v.detach() - before[k] for k, v in model.named_parameters()}


def assert_same_update(full: dict[str, torch.Tensor], accumulated: dict[str, torch.Tensor]) -> None:
    norm = torch.sqrt(sum((d**2).sum() for d in full.values()))
    assert norm > 0
    ratio = torch.sqrt(sum((d**2).sum() for d in accumulated.values())) / norm
    assert abs(ratio - 1) < 1e-3, ratio
    assert max((full[k] - accumulated[k]).abs().max() for k in full) < 1e-5


@pytest.mark.parametrize(("num_labels", "regression"), [(2, False), (1, True)])
def test_gradient_accumulation_matches_full_batch(converted, tmp_path, num_labels, regression):
    def one_update(batch_size: int, accumulation: int) -> dict[str, torch.Tensor]:
        model = _model(converted, num_labels)
        data = TinyTask(4, model.config.vocab_size, regression=regression)
        return one_sgd_update(model, data, tmp_path, batch_size, accumulation)

    assert_same_update(one_update(4, 1), one_update(2, 2))


# --- images ---------------------------------------------------------------------------------------------------


class Digits(Dataset):
    """scikit-learn's bundled digits as 3-channel 32 x 32 images normalised to [-1, 1], as a ViT processor would."""

    def __init__(self, start: int, stop: int):
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.tensor(digits.images[start:stop], dtype=torch.float32)[:, None] / 16.0  # [N, 1, 8, 8]
        images = F.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False)  # [N, 1, 32, 32]
        self.pixel_values = ((images - 0.5) / 0.5).repeat(1, 3, 1, 1)  # [N, 3, 32, 32]
        self.labels = torch.tensor(digits.target[start:stop])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": self.pixel_values[i], "labels": self.labels[i]}


@pytest.fixture
def digits_classifier(converted):
    _, dst = converted("vit", "ViTForImageClassification", num_labels=10)
    return lambda: transformers.AutoModelForImageClassification.from_pretrained(dst)


@pytest.mark.slow
def test_fine_tuning_on_digits_lowers_the_loss(digits_classifier, tmp_path):
    model = digits_classifier()
    train, held_out = Digits(0, 256), Digits(1600, 1728)
    args = _args(
        tmp_path, per_device_train_batch_size=32, per_device_eval_batch_size=128, max_steps=12, learning_rate=3e-3,
        logging_steps=4,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=held_out)
    assert trainer.model_accepts_loss_kwargs  # forward takes **kwargs and normalises by num_items_in_batch
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses[-1] < 0.92 * losses[0], losses
    assert after < 0.92 * before, (before, after)


def test_gradient_accumulation_matches_full_batch_on_digits(digits_classifier, tmp_path):
    def one_update(batch_size: int, accumulation: int) -> dict[str, torch.Tensor]:
        return one_sgd_update(digits_classifier(), Digits(0, 4), tmp_path, batch_size, accumulation)

    assert_same_update(one_update(4, 1), one_update(2, 2))


def test_last_complete_checkpoint_skips_half_written_ones(tmp_path):
    def checkpoint(step: int, *files: str) -> None:
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        for name in files:
            (folder / name).write_bytes(b"")

    assert fivefold.last_complete_checkpoint(tmp_path) is None
    checkpoint(2, "model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json")
    checkpoint(10, "model.safetensors", "optimizer.pt", "rng_state_0.pth", "trainer_state.json")  # rank 1's RNG lost
    checkpoint(12, "model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth")  # no trainer state
    (tmp_path / "checkpoint-14").write_bytes(b"")  # not a folder
    assert fivefold.last_complete_checkpoint(tmp_path, world_size=2) == str(tmp_path / "checkpoint-2")
    assert fivefold.last_complete_checkpoint(tmp_path, world_size=1) is None  # one process writes rng_state.pth
    checkpoint(3, "rng_state.pth", "trainer_state.json")
    checkpoint(20, "rng_state.pth", "trainer_state.json")
    assert fivefold.last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")  # by step, not by name


@pytest.mark.parametrize(
    ("model_type", "stock_name", "auto", "shifted"),
    [
        ("llama", "LlamaForCausalLM", "AutoModelForCausalLM", True),
        ("gpt2", "GPT2LMHeadModel", "AutoModelForCausalLM", True),
        ("t5", "T5ForConditionalGeneration", "AutoModelForSeq2SeqLM", False),
    ],
)
def test_label_smoothing_shifts_labels_as_for_stock(converted, tmp_path, model_type, stock_name, auto, shifted):
    """Trainer shifts labels for label smoothing only for classes its causal-LM table names, by class name: a
    causal LM's, not T5's (whose decoder inputs are the labels shifted already)."""
    src, dst = converted(model_type, stock_name)
    ids = torch.randint(3, 99, (2, 10), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    if not shifted:
        batch["decoder_input_ids"] = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :-1]], dim=1)
    args = transformers.TrainingArguments(tmp_path, label_smoothing_factor=0.1, report_to=[], use_cpu=True)
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    ours = getattr(transformers, auto).from_pretrained(dst).eval()
    assert type(ours).__module__.startswith("fivefold.")
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        want, got = (transformers.Trainer(model=m, args=args).compute_loss(m, dict(batch)) for m in (stock, ours))
        unshifted = transformers.trainer_pt_utils.LabelSmoother(0.1)(ours(**inputs), ids)
    assert got.item() == pytest.approx(want.item(), abs=1e-5)
    assert (abs(got - unshifted) > 1e-2) == shifted
