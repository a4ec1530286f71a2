"""`transformers serve` (the OpenAI-compatible server) on a fivefold folder.

transformers 5.24's model manager (`cli/serving/model_manager.py`) finds the class to load as
`getattr(transformers, config.architectures[0])`, not through the Auto classes: a class outside the transformers
namespace (`FivefoldGPT2LMHeadModel`) stops the server at start-up, with or without `--trust-remote-code`. What
should change upstream: fall back on the Auto class for the config (`AutoModelForCausalLM.from_pretrained`, which
reads `auto_map` under `--trust-remote-code` and registered model types otherwise) when that name is not in the
transformers namespace.

Until then, with nothing patched (one table gains entries: `parse_responses_as_stock`): `servable(folder)` makes the
folder name the Auto class in `architectures`, which the lookup finds in the namespace and which then resolves the
folder's own model type (registered by `import fivefold`) or its shipped code (`--trust-remote-code`). `fivefold
serve ...` is `transformers serve ...` in a process that has imported fivefold, so folders load through the
registered classes without remote code, and with requests past the model's context (its prompt, or the prompt and
`max_tokens`) refused with a 400 before generation (`fivefold/request_limits.py`)."""

import json
from pathlib import Path

# The Auto class the server generates text with, for the class name a saved folder declares.
GENERATING = {"ForCausalLM": "AutoModelForCausalLM", "LMHeadModel": "AutoModelForCausalLM"}


def servable(folder: str | Path) -> Path:
    """Rewrites the folder's config.json so that `transformers serve` can look its class up: `architectures` names
    the Auto class (the model type and `auto_map` choose the class). Saving the model again writes its class name
    back. Returns the folder."""
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    declared = (config.get("architectures") or [""])[0]
    auto = next((auto for suffix, auto in GENERATING.items() if declared.endswith(suffix)), None)
    if auto is None and declared not in GENERATING.values():
        raise ValueError(
            f"{folder} declares architectures {config.get('architectures')!r}: transformers serve generates text, "
            "which fivefold's causal LMs do (save or convert the folder with one)"
        )
    config["architectures"] = [auto or declared]
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return Path(folder)


def parse_responses_as_stock() -> None:
    """transformers' server splits a reply into reasoning, tool calls and text with the tokenizer's response
    template, or, where the tokenizer ships none (Qwen's), with a fallback chosen by the config's model type
    (`_RESPONSE_TEMPLATE_FALLBACKS`, keyed by stock's: `qwen2`, `qwen3_moe`, ...). fivefold's model types are added
    beside the stock types they convert, with the same template."""
    from transformers.cli.serving import utils

    from .architectures import ARCHITECTURES

    fallbacks = getattr(utils, "_RESPONSE_TEMPLATE_FALLBACKS", {})
    for stock_types, template in list(fallbacks.items()):
        ours = tuple(arch.model_type for arch in ARCHITECTURES if arch.stock_model_type in stock_types)
        if ours:
            fallbacks.setdefault(ours, template)


def serve(argv: list[str]) -> int:
    """`transformers serve ARGV` in this process, where importing this package registered fivefold's model types
    (and their response templates: `parse_responses_as_stock`), with requests past a model's context refused up
    front (fivefold.request_limits)."""
    import typer

    from .request_limits import LimitedServe

    parse_responses_as_stock()

    command = typer.Typer(add_completion=False)
    command.command(name="serve")(LimitedServe)
    command(args=[*argv, "--non-blocking"], prog_name="fivefold serve", standalone_mode=False)
    running = LimitedServe.running
    if running is None:  # --help, or arguments refused
        return 0
    try:
        while running._thread.is_alive():
            running._thread.join(timeout=1)
    except KeyboardInterrupt:
        running.kill_server()
    return 0
