"""Summarisation: a small T5 trained from scratch on `aclsum` (ACL papers' abstracts -> their short summaries of
challenge, approach and outcome), ROUGE-1/2/L on the test papers, beside a lead baseline (the abstract's first two
sentences). No pre-trained T5 can be had offline, so this T5 starts from random weights and learns from 150
papers only: expect ROUGE well below the baseline; the example shows the seq2seq path end to end, not a good
summariser. It uses MiniLM's WordPiece vocabulary ([SEP] as end of sequence), as no T5 tokenizer ships offline.

    python examples/summarization.py [--output-dir DIR] [--smoke | --full]
"""

import json
import time

import torch
import transformers
from datasets import load_dataset
from rouge_score import rouge_scorer

import fivefold

from common import logged, minilm_folder, package_file, parser, plot_curves, setup, training_args, write_results

SUMMARY_PARTS = ("challenge", "approach", "outcome")


def read_split(split: str):
    """aclsum's jsonl through `datasets`: the abstract as the document, the three summary parts as the target."""
    data = load_dataset("json", data_files=str(package_file("aclsum", "dataset", f"{split}.jsonl")), split="train")
    return data.map(
        lambda row: {
            "document": " ".join(row["sentences"]["abstract"]),
            "lead": " ".join(row["sentences"]["abstract"][:2]),
            "summary": " ".join(row["summary"][part] for part in SUMMARY_PARTS),
        },
        remove_columns=data.column_names,
    )


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(ref, pred) for pred, ref in zip(predictions, references, strict=True)]
    return {name: round(sum(s[name].fmeasure for s in scores) / len(scores), 4) for name in scores[0]}


def main(argv: list[str] | None = None) -> dict:
    args = parser(__doc__.splitlines()[0], "examples/runs/summarization").parse_args(argv)
    out, started = setup(args), time.time()
    train, test = read_split("train"), read_split("test")
    if not args.smoke:  # aclsum's validation papers join the training set
        from datasets import concatenate_datasets

        train = concatenate_datasets([train, read_split("val")])
    if args.smoke:
        train, test = train.select(range(8)), test.select(range(4))
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_folder())
    eos = tokenizer.sep_token_id

    def encode(rows):
        sources = tokenizer(rows["document"], add_special_tokens=False, truncation=True, max_length=255)["input_ids"]
        targets = tokenizer(rows["summary"], add_special_tokens=False, truncation=True, max_length=95)["input_ids"]
        return {"input_ids": [[*s, eos] for s in sources], "labels": [[*t, eos] for t in targets]}

    train_set = train.map(encode, batched=True, remove_columns=train.column_names)
    config = fivefold.FivefoldT5Config(
        vocab_size=tokenizer.vocab_size,
        d_model=128,
        d_kv=32,
        d_ff=512,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos,
        decoder_start_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,  # T5 v1.0's: the output layer reads the embeddings, scaled by d_model ** -0.5
    )
    torch.manual_seed(args.seed)
    model = fivefold.FivefoldT5ForConditionalGeneration(config)
    epochs = 1 if args.smoke else 150 if args.full else 60  # the default: about 10 minutes on 2 cores
    trainer = transformers.Trainer(
        model=model,
        args=training_args(
            out,
            args,
            num_train_epochs=epochs,
            max_steps=2 if args.smoke else -1,
            per_device_train_batch_size=4 if args.smoke else 10,
            learning_rate=2e-3,
            warmup_steps=0.05,
        ),
        train_dataset=train_set,
        data_collator=transformers.DataCollatorForSeq2Seq(tokenizer, model=model),
    )
    trainer.train()

    model.eval()
    predictions = []
    for start in range(0, len(test), 16):
        rows = test[start : start + 16]["document"]
        batch = tokenizer(rows, add_special_tokens=False, truncation=True, max_length=255, padding=True)
        batch = {k: torch.tensor(v) for k, v in batch.items() if k != "token_type_ids"}
        with torch.no_grad():
            generated = model.generate(**batch, max_new_tokens=8 if args.smoke else 96, num_beams=1, do_sample=False)
        predictions += tokenizer.batch_decode(generated, skip_special_tokens=True)
    scores = rouge(predictions, test["summary"])
    baseline = rouge(test["lead"], test["summary"])
    plot_curves(out / "loss.png", {"training loss": logged(trainer.state.log_history, "loss")}, "T5 on aclsum")
    (out / "samples.json").write_text(
        json.dumps(
            [{"prediction": p, "reference": r} for p, r in zip(predictions[:5], test["summary"][:5], strict=False)],
            indent=2,
        )
    )
    return write_results(
        out,
        "summarization",
        args,
        started,
        model=f"T5 from random weights ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        "d_model 128, 2 + 2 layers); no pre-trained T5 is available offline",
        train_papers=len(train),
        test_papers=len(test),
        epochs=epochs,
        rouge=scores,
        rouge_lead_baseline=baseline,
        plots=["loss.png"],
        samples="samples.json",
    )


if __name__ == "__main__":
    main()
