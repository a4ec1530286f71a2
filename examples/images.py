"""Images: a small ViT trained from scratch on Fashion-MNIST (Debian's `dataset-fashion-mnist`, 28 x 28 grey
images of 10 kinds of clothing), accuracy on the official test images and a confusion-matrix plot.

    python examples/images.py [--output-dir DIR] [--smoke | --full]
"""

import gzip
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import transformers
from datasets import Dataset

import fivefold

from common import MissingData, logged, parser, plot_curves, setup, training_args, write_results

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST's format): a magic number whose last byte is the rank, the sizes, then uint8 data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    rank = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(shape)


def fashion_mnist(split: str, count: int | None, seed: int) -> Dataset:
    prefix = "train" if split == "train" else "t10k"
    images_file = FASHION_MNIST / f"{prefix}-images-idx3-ubyte.gz"
    if not images_file.is_file():
        raise MissingData(f"{images_file} is missing: `sudo apt-get install dataset-fashion-mnist` (Debian, Ubuntu)")
    images, labels = read_idx(images_file), read_idx(FASHION_MNIST / f"{prefix}-labels-idx1-ubyte.gz")
    data = Dataset.from_dict({"image": images, "label": labels.astype(np.int64)})
    data = data.shuffle(seed=seed)
    return data if count is None else data.select(range(count))


def to_pixels(rows) -> dict:
    """uint8 [28, 28] -> float [1, 28, 28], scaled to [-1, 1]."""
    images = torch.tensor(np.asarray(rows["image"], dtype=np.float32)) / 127.5 - 1
    return {"pixel_values": images.unsqueeze(1), "labels": rows["label"]}


def plot_confusion(path: Path, gold: np.ndarray, predicted: np.ndarray) -> None:
    counts = np.zeros((len(CLASSES), len(CLASSES)), dtype=int)
    np.add.at(counts, (gold, predicted), 1)
    fig, ax = plt.subplots(figsize=(6, 5.5))
    ax.imshow(counts, cmap="Blues")
    ax.set(xticks=range(len(CLASSES)), yticks=range(len(CLASSES)), xlabel="predicted", ylabel="true")
    ax.set_xticklabels(CLASSES, rotation=60, ha="right")
    ax.set_yticklabels(CLASSES)
    for (i, j), n in np.ndenumerate(counts):
        ax.text(j, i, n, ha="center", va="center", fontsize=6, color="white" if n > counts.max() / 2 else "black")
    ax.set_title("ViT on Fashion-MNIST: confusion matrix (test)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    args = parser(__doc__.splitlines()[0], "examples/runs/images").parse_args(argv)
    out, started = setup(args), time.time()
    train_count, test_count, epochs = (32, 32, 1) if args.smoke else (None, None, 5) if args.full else (12000, 2000, 2)
    train = fashion_mnist("train", train_count, args.seed).with_transform(to_pixels)
    test = fashion_mnist("test", test_count, args.seed).with_transform(to_pixels)

    config = fivefold.FivefoldViTConfig(
        image_size=28,
        patch_size=4,  # 7 x 7 patches
        num_channels=1,
        hidden_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=192,
        num_labels=len(CLASSES),
        id2label=dict(enumerate(CLASSES)),
        label2id={name: i for i, name in enumerate(CLASSES)},
    )
    model = fivefold.FivefoldViTForImageClassification(config)
    trainer = transformers.Trainer(
        model=model,
        args=training_args(
            out,
            args,
            num_train_epochs=epochs,
            max_steps=2 if args.smoke else -1,
            per_device_train_batch_size=16 if args.smoke else 64,
            per_device_eval_batch_size=256,
            learning_rate=1e-3,
            weight_decay=0.05,
            warmup_steps=0.05,
            remove_unused_columns=False,  # the transform needs "image"
        ),
        train_dataset=train,
    )
    trainer.train()
    prediction = trainer.predict(test)
    predicted = prediction.predictions.argmax(-1)
    accuracy = float((predicted == prediction.label_ids).mean())
    plot_curves(out / "loss.png", {"training loss": logged(trainer.state.log_history, "loss")}, "ViT Fashion-MNIST")
    plot_confusion(out / "confusion_matrix.png", prediction.label_ids, predicted)
    return write_results(
        out,
        "images",
        args,
        started,
        model=f"ViT from scratch ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, 7 x 7 patches)",
        train_images=len(train),
        test_images=len(test),
        epochs=epochs,
        accuracy=round(accuracy, 4),
        plots=["loss.png", "confusion_matrix.png"],
    )


if __name__ == "__main__":
    main()
