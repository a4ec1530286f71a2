"""`fivefold demo`: for every architecture, a tiny stock checkpoint -> convert -> load through the Auto
classes -> parity against stock, printed as a table. Needs nothing but the install."""

import tempfile
from pathlib import Path

import torch
import transformers

from fivefold.architectures import ARCHITECTURES

from .architecture import stock_class_name
from .convert import convert
from .errors import ConversionError
from .samples import build_stock_checkpoint
from .verify import compare

TOLERANCE = 1e-4


def _auto_class_for(arch, stock_class: str) -> str:
    return next(auto for auto, cls in arch.models.items() if cls.__name__ == f"Fivefold{stock_class}")


def run_demo(print_fn=print, only: list[str] | None = None) -> bool:
    """The table for every architecture, or for the stock model types in `only`."""
    known = [arch.stock_model_type for arch in ARCHITECTURES]
    unknown = [name for name in only or () if name not in known]
    if unknown:
        raise ConversionError(f"no architecture {', '.join(unknown)} in the table; it has {', '.join(known)}")
    transformers.utils.logging.disable_progress_bar()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fivefold-demo-") as tmp:
        for arch in (a for a in ARCHITECTURES if not only or a.stock_model_type in only):
            for cls in arch.models.values():
                stock_name = stock_class_name(cls)
                src = Path(tmp) / f"{stock_name}-stock"
                dst = Path(tmp) / f"{stock_name}-fivefold"
                build_stock_checkpoint(arch.stock_model_type, stock_name, src)
                convert(src, dst, progress=False)
                auto = _auto_class_for(arch, stock_name)
                ours = getattr(transformers, auto).from_pretrained(dst).eval()
                stock = getattr(transformers, stock_name).from_pretrained(src).eval()
                diffs = compare(stock, ours, arch.sample_inputs(stock.config, stock_name, 0))
                worst = max(diffs.values())
                rows.append((arch.stock_model_type, stock_name, f"{auto} -> {type(ours).__name__}", worst))
    width = max(len(r[2]) for r in rows)
    batches = "ragged padded text batches, images at native size"
    print_fn(f"fivefold demo: tiny random checkpoints, fp32, {batches}, torch {torch.__version__}")
    arch_width = max(len(r[0]) for r in rows)
    class_width = max(len(r[1]) for r in rows)
    print_fn(f"{'arch':{arch_width}} {'stock class':{class_width}} {'loaded through':{width}} {'max |diff|':>10}  ok")
    for model_type, stock_name, loaded, worst in rows:
        ok = worst <= TOLERANCE
        row = f"{model_type:{arch_width}} {stock_name:{class_width}} {loaded:{width}} {worst:10.2e}"
        print_fn(f"{row}  {'yes' if ok else 'NO'}")
    passed = all(r[3] <= TOLERANCE for r in rows)
    print_fn(f"{len(rows)} checkpoints, all within {TOLERANCE:g}: {'yes' if passed else 'NO'}")
    return passed
