"""Fine-tuning a converted ViT with Trainer on real images (scikit-learn's handwritten digits, 8 x 8 resized to
32 x 32): the held-out loss goes down; gradient accumulation 2 x 2 gives the update of one batch of 4."""

import pytest
import torch
import transformers
from test_trainer import _args, assert_same_update, one_sgd_update
from torch.nn import functional as F
from torch.utils.data import Dataset


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
def classifier(converted):
    _, dst = converted("vit", "ViTForImageClassification", num_labels=10)
    return lambda: transformers.AutoModelForImageClassification.from_pretrained(dst)


def test_fine_tuning_on_digits_lowers_the_loss(classifier, tmp_path):
    model = classifier()
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


def test_gradient_accumulation_matches_full_batch(classifier, tmp_path):
    def one_update(batch_size: int, accumulation: int) -> dict[str, torch.Tensor]:
        return one_sgd_update(classifier(), Digits(0, 4), tmp_path, batch_size, accumulation)

    assert_same_update(one_update(4, 1), one_update(2, 2))
