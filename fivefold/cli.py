"""The `fivefold` command: convert, verify, export, demo."""

import argparse
import logging
import sys
import warnings

from fivefold.conversion.errors import CheckpointWarning, ConversionError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fivefold", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="convert a public checkpoint (folder or Hub id) to fivefold's layout")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="cast floating tensors")
    p.add_argument("--max-shard-size", default="5GB", help="shard the weights past this size (default 5GB)")
    p.add_argument("--force", action="store_true", help="replace an existing DST")

    p = sub.add_parser("verify", help="run stock SRC and fivefold DST on the same inputs, print max abs diffs")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--atol", type=float, default=1e-4, help="fail above this difference (default 1e-4)")

    p = sub.add_parser("export", help="write a fivefold checkpoint back in the stock layout")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--max-shard-size", default="5GB")
    p.add_argument("--force", action="store_true", help="replace an existing OUT")

    sub.add_parser("demo", help="convert a tiny checkpoint of every architecture and print a parity table")
    return parser


def _warning_line(command: str):
    """Checkpoint warnings as one line naming the command, like the errors; other warnings as usual."""
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, CheckpointWarning):
            print(f"fivefold {command}: warning: {message}", file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _warning_line(args.command)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    # Keep transformers' load reports and loading bars off the terminal: the tables here say what matters.
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        if args.command == "convert":
            from fivefold.conversion import convert

            dst = convert(args.src, args.dst, dtype=args.dtype, max_shard_size=args.max_shard_size, force=args.force)
            print(f"converted {args.src} -> {dst}")
        elif args.command == "export":
            from fivefold.conversion import export

            out = export(args.src, args.out, max_shard_size=args.max_shard_size, force=args.force)
            print(f"exported {args.src} -> {out}")
        elif args.command == "verify":
            from fivefold.conversion.verify import verify

            diffs = verify(args.src, args.dst)
            for name, diff in diffs.items():
                print(f"{name:40} {diff:.3e}")
            worst = max(diffs.values())
            print(f"max abs diff {worst:.3e} ({'within' if worst <= args.atol else 'ABOVE'} {args.atol:g})")
            return 0 if worst <= args.atol else 1
        elif args.command == "demo":
            from fivefold.conversion.demo import run_demo

            return 0 if run_demo() else 1
    except ConversionError as e:
        print(f"fivefold {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
