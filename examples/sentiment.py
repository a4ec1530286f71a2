"""Sentiment: the real all-MiniLM-L6-v2 fine-tuned on the movie-review snippets of vaderSentiment (Hutto &
Gilbert, 2014; label: mean human rating > 0), accuracy and F1 on a held-out split through `evaluate` (local
metric scripts), before and after fine-tuning.

    python examples/sentiment.py [--output-dir DIR] [--smoke | --full]
"""

import csv
import time

import evaluate
import numpy as np
import transformers
from datasets import load_dataset

import fivefold

from common import (
    DATA,
    HERE,
    MissingData,
    logged,
    minilm_folder,
    parser,
    plot_curves,
    setup,
    training_args,
    write_results,
)

SNIPPETS = DATA / "hutto_ICWSM_2014" / "movieReviewSnippets_GroundTruth.txt"


def snippets(test_size: int, train_size: int | None, seed: int):
    if not SNIPPETS.is_file():
        raise MissingData(f"{SNIPPETS} is missing: run examples/get_data.sh")
    data = load_dataset(
        "csv",
        data_files=str(SNIPPETS),
        delimiter="\t",
        column_names=["id", "score", "text"],
        quoting=csv.QUOTE_NONE,
        split="train",
    )
    data = data.map(lambda row: {"label": int(row["score"] > 0)})
    split = data.train_test_split(test_size=test_size, seed=seed)
    train = split["train"] if train_size is None else split["train"].select(range(train_size))
    return train, split["test"]


def main(argv: list[str] | None = None) -> dict:
    args = parser(__doc__.splitlines()[0], "examples/runs/sentiment").parse_args(argv)
    out, started = setup(args), time.time()
    train_size, test_size, epochs = (16, 16, 1) if args.smoke else (None, 1000, 2) if args.full else (2000, 1000, 1)
    train, test = snippets(test_size, train_size, args.seed)

    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_folder())
    encode = lambda rows: tokenizer(rows["text"], truncation=True, max_length=64)  # noqa: E731
    train, test = (d.map(encode, batched=True, remove_columns=["id", "score", "text"]) for d in (train, test))
    # A stock folder loads straight into a fivefold class (converted in memory); the classifier is new.
    model = fivefold.FivefoldBertForSequenceClassification.from_pretrained(minilm_folder(), num_labels=2)

    metrics = evaluate.combine([str(HERE / "metrics" / "accuracy.py"), str(HERE / "metrics" / "f1.py")])

    def compute_metrics(prediction: transformers.EvalPrediction) -> dict:
        return metrics.compute(predictions=np.argmax(prediction.predictions, -1), references=prediction.label_ids)

    trainer = transformers.Trainer(
        model=model,
        args=training_args(
            out,
            args,
            num_train_epochs=epochs,
            max_steps=2 if args.smoke else -1,
            per_device_train_batch_size=8 if args.smoke else 32,
            per_device_eval_batch_size=64,
            learning_rate=5e-5,
            warmup_steps=0.1,
        ),
        train_dataset=train,
        eval_dataset=test,
        data_collator=transformers.DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics,
    )
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    plot_curves(out / "loss.png", {"training loss": logged(trainer.state.log_history, "loss")}, "MiniLM sentiment")
    return write_results(
        out,
        "sentiment",
        args,
        started,
        model="all-MiniLM-L6-v2 (real weights) + a new classifier",
        train_examples=len(train),
        test_examples=len(test),
        epochs=epochs,
        accuracy_before=round(before["eval_accuracy"], 4),
        f1_before=round(before["eval_f1"], 4),
        accuracy=round(after["eval_accuracy"], 4),
        f1=round(after["eval_f1"], 4),
        plots=["loss.png"],
    )


if __name__ == "__main__":
    main()
