"""Pre-training: a small BERT from scratch on masked LM + next-sentence prediction over the papers of `aclsum`
(their abstract, introduction and conclusion sentences), both loss curves; then masked LM alone on ragged
chunks, padded and packed, to measure the tokens per second that packing gains.

    python examples/pretraining.py [--output-dir DIR] [--smoke | --full]
"""

import json
import random
import time

import torch
import transformers
from datasets import Dataset

import fivefold

from common import logged, minilm_folder, package_file, parser, plot_curves, setup, training_args, write_results

SECTIONS = ("abstract", "introduction", "conclusion")


def papers() -> list[list[str]]:
    """One document per paper: its sentences, section after section (train, val and test files together)."""
    documents = []
    for split in ("train", "val", "test"):
        for line in package_file("aclsum", "dataset", f"{split}.jsonl").read_text(encoding="utf-8").splitlines():
            sentences = json.loads(line)["sentences"]
            documents.append([s for section in SECTIONS for s in sentences.get(section, [])])
    return documents


def ragged_chunks(documents: list[list[str]], seed: int) -> list[str]:
    """Runs of 1 to 4 consecutive sentences: examples of very different lengths, as real text comes."""
    rng, chunks = random.Random(seed), []
    for sentences in documents:
        i = 0
        while i < len(sentences):
            n = rng.randint(1, 4)
            chunks.append(" ".join(sentences[i : i + n]))
            i += n
    return chunks


def small_bert(tokenizer, **overrides) -> fivefold.FivefoldBertConfig:
    return fivefold.FivefoldBertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=128,
        **overrides,
    )


def mlm_speed(tokenizer, chunks: Dataset, steps: int, out, args, packed: bool, unpad: bool) -> dict:
    """Masked LM alone (no NSP: a packed row has no [CLS] per document) for `steps` steps: real tokens per second."""
    torch.manual_seed(args.seed)
    model = fivefold.FivefoldBertForMaskedLM(small_bert(tokenizer, unpad_inputs=unpad))
    masked_lm = fivefold.masked_lm_collator(tokenizer, seed=args.seed)
    collator = fivefold.PackedMaskedLMCollator(masked_lm) if packed else masked_lm
    batch_size = 4 if args.smoke else 32
    trainer = transformers.Trainer(
        model=model,
        args=training_args(out, args, max_steps=steps, per_device_train_batch_size=batch_size, learning_rate=5e-4),
        train_dataset=chunks,
        data_collator=collator,
    )
    result = trainer.train()
    order = list(trainer.get_train_dataloader().sampler)  # the same order the run used (seeded)
    tokens = sum(len(chunks[i]["input_ids"]) for i in order[: steps * batch_size])
    return {
        "tokens": tokens,
        "seconds": round(result.metrics["train_runtime"], 2),
        "tokens_per_second": round(tokens / result.metrics["train_runtime"], 1),
        "final_loss": round(trainer.state.log_history[-2]["loss"], 4),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parser(__doc__.splitlines()[0], "examples/runs/pretraining").parse_args(argv)
    out, started = setup(args), time.time()
    documents = papers()
    steps, speed_steps = (2, 1) if args.smoke else (1500, 100) if args.full else (100, 20)
    max_length = 32 if args.smoke else 128
    if args.smoke:
        documents = documents[:4]
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_folder())  # BERT's uncased WordPiece vocabulary

    pairs = Dataset.from_list(fivefold.next_sentence_pairs(documents, tokenizer, max_length=max_length, seed=args.seed))
    torch.manual_seed(args.seed)
    model = fivefold.FivefoldBertForPreTraining(small_bert(tokenizer))
    trainer = fivefold.PreTrainingTrainer(
        model=model,
        args=training_args(
            out,
            args,
            max_steps=steps,
            per_device_train_batch_size=4 if args.smoke else 16,
            learning_rate=5e-4,
            warmup_steps=0.05,
            logging_steps=1 if args.smoke else 5,
        ),
        train_dataset=pairs,
        data_collator=fivefold.masked_lm_collator(tokenizer, seed=args.seed),
    )
    trainer.train()
    history = trainer.state.log_history
    curves = {"masked LM": logged(history, "mlm_loss"), "next sentence": logged(history, "nsp_loss")}
    plot_curves(out / "losses.png", curves, "BERT pre-training from scratch (aclsum)")

    chunks = Dataset.from_dict(tokenizer(ragged_chunks(documents, args.seed), truncation=True, max_length=max_length))
    chunks = chunks.remove_columns([c for c in chunks.column_names if c != "input_ids"])
    speed = {
        "padded, unpad_inputs=False": mlm_speed(tokenizer, chunks, speed_steps, out, args, packed=False, unpad=False),
        "padded, unpadded inside (default)": mlm_speed(tokenizer, chunks, speed_steps, out, args, False, True),
        "packed (DataCollatorWithFlattening)": mlm_speed(tokenizer, chunks, speed_steps, out, args, True, True),
    }
    baseline = speed["padded, unpad_inputs=False"]["tokens_per_second"]
    for run in speed.values():
        run["speedup"] = round(run["tokens_per_second"] / baseline, 2)
    last = [entry for entry in history if "mlm_loss" in entry][-1]
    return write_results(
        out,
        "pretraining",
        args,
        started,
        model=f"BERT from scratch, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters "
        "(hidden 128, 2 layers; MiniLM's WordPiece vocabulary)",
        documents=len(documents),
        nsp_pairs=len(pairs),
        steps=steps,
        mlm_loss_first=next(entry for entry in history if "mlm_loss" in entry)["mlm_loss"],
        mlm_loss_last=last["mlm_loss"],
        nsp_loss_first=next(entry for entry in history if "nsp_loss" in entry)["nsp_loss"],
        nsp_loss_last=last["nsp_loss"],
        mlm_speed_steps=speed_steps,
        mlm_tokens_per_second=speed,
        plots=["losses.png"],
    )


if __name__ == "__main__":
    main()
