"""Peak memory of converting a sharded checkpoint far larger than one shard: `fivefold convert` must read and write
shard by shard.

Writes a random Mixtral checkpoint in the public layout (bf16, sharded safetensors with an index, generated one
shard at a time so that this script never holds it either), then runs `fivefold convert` on it in a child process
under `/usr/bin/time -v` (or, where that is missing, the kernel's peak-RSS count for children) and reports the
child's peak resident memory against the checkpoint's size and its shard size. The default is a 12 GB checkpoint
in 1 GB shards (about 25 GB of disk for the source and the conversion, removed at the end).

    python benchmarks/conversion.py                          # 12 GB, 1 GB shards
    python benchmarks/conversion.py --gb 24 --shard-gb 2 --out results.md --json results.json
    python benchmarks/conversion.py --quick                  # ~60 MB in 8 MB shards: a smoke test
"""

import json
import re
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import transformers
from harness import command_line, machine_line, parse, python, table, write_report
from safetensors.torch import save_file
from transformers.core_model_loading import revert_weight_conversion

# Mixtral's shapes narrowed so that the layer count sets the size: ~0.58 GB a layer in bf16.
FIELDS = dict(
    vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=4,
    num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096, tie_word_embeddings=False,
)  # fmt: skip
QUICK_FIELDS = dict(FIELDS, vocab_size=1000, hidden_size=128, intermediate_size=512, num_attention_heads=4)


def stock_shapes(fields: dict) -> tuple[transformers.MixtralConfig, dict[str, tuple[int, ...]]]:
    """The config and the tensors save_pretrained would write for it, from a model on the meta device."""
    config = transformers.MixtralConfig(**fields)
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(config)
    return config, {k: tuple(v.shape) for k, v in revert_weight_conversion(model, model.state_dict()).items()}


def layers_for(gb: float, fields: dict) -> int:
    _, one = stock_shapes({**fields, "num_hidden_layers": 1})
    _, two = stock_shapes({**fields, "num_hidden_layers": 2})
    size = lambda shapes: sum(torch.Size(s).numel() * 2 for s in shapes.values())  # noqa: E731
    per_layer, rest = size(two) - size(one), 2 * size(one) - size(two)
    return max(1, round((gb * 1e9 - rest) / per_layer))


def write_random_checkpoint(folder: Path, fields: dict, shard_bytes: int) -> tuple[int, int]:
    """A sharded bf16 checkpoint of random weights, one shard in memory at a time -> (bytes, shards)."""
    config, shapes = stock_shapes(fields)
    config.architectures = ["MixtralForCausalLM"]
    config.dtype = torch.bfloat16
    config.save_pretrained(folder)
    shards, current, used = [], {}, 0
    gen = torch.Generator().manual_seed(0)

    def flush() -> None:
        name = f"model-{len(shards) + 1:05d}.safetensors"
        save_file(current, str(folder / name), metadata={"format": "pt"})
        shards.append((name, list(current)))
        current.clear()

    total = 0
    for key, shape in shapes.items():
        nbytes = torch.Size(shape).numel() * 2
        if current and used + nbytes > shard_bytes:
            flush()
            used = 0
        current[key] = (torch.randn(shape, generator=gen) * 0.02).bfloat16()
        used, total = used + nbytes, total + nbytes
    flush()
    weight_map = {}
    for i, (name, keys) in enumerate(shards):  # the public naming: model-0000i-of-0000n.safetensors
        final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (folder / name).rename(folder / final)
        weight_map.update(dict.fromkeys(keys, final))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total, len(shards)


def peak_rss_of(command: list[str]) -> tuple[int, float]:
    """(peak resident bytes, seconds) of a child process, from /usr/bin/time -v where it exists."""
    timer = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    start = time.perf_counter()
    if timer:
        run = subprocess.run([timer, "-v", *command], capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"conversion failed:\n{run.stderr[-3000:]}")
        kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)[1])
    else:
        subprocess.run(command, check=True, capture_output=True)
        kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
    return kib * 1024, time.perf_counter() - start


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--gb", type=float, default=12.0, help="checkpoint size in GB (default 12)")
    parser.add_argument("--shard-gb", type=float, default=1.0, help="shard size of source and conversion")
    parser.add_argument("--dir", help="where to write the checkpoints (default: a temporary folder)")
    args = parse(parser)
    fields = QUICK_FIELDS if args.quick else FIELDS
    if args.quick:
        args.gb, args.shard_gb = 0.06, 0.008
    shard_bytes = int(args.shard_gb * 1e9)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        src, dst = Path(folder, "stock"), Path(folder, "fivefold")
        src.mkdir()
        layers = layers_for(args.gb, fields)
        total, shards = write_random_checkpoint(src, {**fields, "num_hidden_layers": layers}, shard_bytes)
        command = [python(), "-m", "fivefold", "convert", str(src), str(dst), "--max-shard-size"]
        peak, seconds = peak_rss_of([*command, str(shard_bytes)])
        written = sum(f.stat().st_size for f in dst.glob("*.safetensors"))
    header = ["checkpoint", "shards", "peak RSS", "peak / checkpoint", "peak / shard", "seconds", "written"]
    row = [
        f"Mixtral {layers} layers, bf16, {total / 1e9:.2f} GB",
        f"{shards} x {args.shard_gb:g} GB",
        f"{peak / 1e9:.2f} GB",
        f"{peak / total:.2f}x",
        f"{peak / shard_bytes:.2f}x",
        f"{seconds:.0f}",
        f"{written / 1e9:.2f} GB",
    ]
    lines = [machine_line("fivefold convert in a child process, peak RSS by /usr/bin/time -v"), ""]
    write_report([*lines, *table(header, [row])], args.out, args.json)


if __name__ == "__main__":
    main()
