"""The `fivefold` command: convert, verify, export, push, demo, serve (`transformers serve`, fivefold imported)."""

import argparse
import logging
import sys
import warnings

from fivefold.architectures import NAMES
from fivefold.conversion.errors import CheckpointWarning, ConversionError

_SOURCES = "a local checkpoint folder or a Hub repo id (org/name)"
_TYPES = ", ".join(NAMES)


def _version() -> str:
    from fivefold import __version__

    return f"fivefold {__version__}"


def _hub_source(p: argparse.ArgumentParser, what: str, prefix: str = "") -> None:
    p.add_argument(f"--{prefix}revision", help=f"branch, tag or commit of {what} when it is a Hub repo (default main)")
    p.add_argument(f"--{prefix}subfolder", help=f"the folder inside {what} that holds the checkpoint")


def _token(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token", help="Hub token for private repos and pushing (default: HF_TOKEN or the stored login)")


def _quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, nothing printed on success")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fivefold", description=__doc__)
    parser.add_argument("--version", action="version", version=_version(), help="print fivefold's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="convert a public checkpoint (folder or Hub id) to fivefold's layout")
    p.add_argument("src", help=f"the stock checkpoint: {_SOURCES}; model types: {_TYPES}")
    p.add_argument("dst", help="the folder to write (must not exist unless --force)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="cast floating tensors")
    p.add_argument("--max-shard-size", default="5GB", help="shard the weights past this size (default 5GB)")
    p.add_argument("--force", action="store_true", help="replace an existing DST")
    _hub_source(p, "SRC")
    _token(p)
    p.add_argument("--push-to-hub", metavar="ORG/NAME", help="then upload DST whole to this Hub repo in one commit")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    p.add_argument("--commit-message", help="with --push-to-hub: the commit's message")
    _quiet(p)

    p = sub.add_parser("verify", help="run stock SRC and fivefold DST on the same inputs, print max abs diffs")
    p.add_argument("src", nargs="?", help=f"the stock checkpoint: {_SOURCES}")
    p.add_argument("dst", nargs="?", help=f"its fivefold conversion: {_SOURCES}")
    p.add_argument("--integrity", metavar="FOLDER", help="instead: check every file of a converted FOLDER against "
                   "the sha256 its model card records")  # fmt: skip
    p.add_argument("--atol", type=float, default=1e-4, help="fail above this difference (default 1e-4)")
    _hub_source(p, "SRC")
    _hub_source(p, "DST", prefix="dst-")
    _token(p)

    p = sub.add_parser("export", help="write a fivefold checkpoint back in the stock layout")
    p.add_argument("src", help=f"the fivefold checkpoint: {_SOURCES}")
    p.add_argument("out", help="the folder to write (must not exist unless --force)")
    p.add_argument("--max-shard-size", default="5GB", help="shard the weights past this size (default 5GB)")
    p.add_argument("--force", action="store_true", help="replace an existing OUT")
    _hub_source(p, "SRC")
    _token(p)
    _quiet(p)

    p = sub.add_parser("push", help="upload a converted folder to the Hub in one commit")
    p.add_argument("folder", help="the folder to upload whole (e.g. the DST of `fivefold convert`)")
    p.add_argument("repo_id", metavar="ORG/NAME", help="the Hub repo, created if missing")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--commit-message", help="the commit's message")
    p.add_argument("--revision", help="the branch to push to, created if missing (default main)")
    p.add_argument("--subfolder", help="the folder inside the repo to upload into (default its top)")
    _token(p)
    _quiet(p)

    p = sub.add_parser("demo", help="convert a tiny checkpoint of every architecture and print a parity table")
    p.add_argument("architectures", nargs="*", metavar="MODEL_TYPE", help="only these (stock model types: bert, …)")
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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # every option is transformers serve's own
        from fivefold.serving import serve

        return serve(argv[1:])
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _warning_line(args.command)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    # Keep transformers' load reports and loading bars off the terminal: the tables here say what matters.
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from fivefold.conversion.hub import bound_hub_requests

    bound_hub_requests()
    quiet = getattr(args, "quiet", False)
    say = (lambda *a: None) if quiet else print
    hub = dict(revision=getattr(args, "revision", None), subfolder=getattr(args, "subfolder", None))
    token = getattr(args, "token", None)
    try:
        if args.command == "convert":
            from fivefold.conversion import convert

            options = dict(dtype=args.dtype, max_shard_size=args.max_shard_size, force=args.force, progress=not quiet)
            push = dict(push_to_hub=args.push_to_hub, private=args.private or None, commit_message=args.commit_message)
            dst = convert(args.src, args.dst, **options, **hub, token=token, **push)
            say(f"converted {args.src} -> {dst}" + (f" -> pushed to {args.push_to_hub}" if args.push_to_hub else ""))
        elif args.command == "export":
            from fivefold.conversion import export

            options = dict(max_shard_size=args.max_shard_size, force=args.force, progress=not quiet)
            out = export(args.src, args.out, **options, **hub, token=token)
            say(f"exported {args.src} -> {out}")
        elif args.command == "push":
            from fivefold.conversion import push_folder

            options = dict(private=args.private or None, commit_message=args.commit_message, token=token)
            url = push_folder(args.folder, args.repo_id, **options, **hub)
            say(f"pushed {args.folder} -> {args.repo_id} ({url})")
        elif args.command == "verify" and args.integrity is not None:
            return _check_integrity(args)
        elif args.command == "verify":
            if args.src is None or args.dst is None:
                raise ConversionError("verify needs SRC and DST (or --integrity FOLDER)")
            from fivefold.conversion import verify

            dst_hub = dict(dst_revision=args.dst_revision, dst_subfolder=args.dst_subfolder)
            diffs = verify(args.src, args.dst, **hub, **dst_hub, token=token)
            for name, diff in diffs.items():
                print(f"{name:40} {diff:.3e}")
            worst = max(diffs.values())
            print(f"max abs diff {worst:.3e} ({'within' if worst <= args.atol else 'ABOVE'} {args.atol:g})")
            return 0 if worst <= args.atol else 1
        elif args.command == "demo":
            from fivefold.conversion.demo import run_demo

            return 0 if run_demo(only=args.architectures) else 1
    except ConversionError as e:
        print(f"fivefold {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


def _check_integrity(args: argparse.Namespace) -> int:
    from fivefold.conversion.integrity import check_folder

    if args.src is not None:
        raise ConversionError("verify --integrity takes one FOLDER, not SRC and DST")
    recorded, findings = check_folder(args.integrity)
    for finding in findings:
        print(f"fivefold verify: {finding}", file=sys.stderr)
    bad = {f.name for f in findings}
    print(f"{len(recorded) - len(bad & set(recorded))} of {len(recorded)} files match their recorded sha256"
          + (f"; {len(findings)} problem(s)" if findings else ""))  # fmt: skip
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
