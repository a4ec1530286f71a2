"""The oneDNN linear on a torch that lacks one of the private internals it reads: each is found by feature, and a
missing one turns the path off with one warning, never an exception, in the package and in the remote code a
converted folder ships (which runs on torch versions fivefold never saw)."""

import subprocess
import sys
import textwrap
import types

import pytest
import torch

from fivefold.architectures import ARCHITECTURES
from fivefold.modeling.linear import PRIVATE_SYMBOLS, find_private, find_private_symbols

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")


def hide(monkeypatch, path: str) -> None:
    owner_path, _, name = path.rpartition(".")
    if owner_path == "torch.ops.mkldnn":  # an op namespace resolves names lazily: replace the namespace
        monkeypatch.setattr(torch.ops, "mkldnn", types.SimpleNamespace())
    else:
        monkeypatch.delattr(find_private(owner_path), name)


@pytest.mark.parametrize("path", PRIVATE_SYMBOLS)
def test_each_private_symbol_is_found_by_feature(monkeypatch, path):
    found, missing = find_private_symbols()
    assert missing == () and set(found) == set(PRIVATE_SYMBOLS)
    hide(monkeypatch, path)
    found, missing = find_private_symbols()
    assert missing == (path,) and path not in found


HIDDEN_RUN = textwrap.dedent(
    """
    import importlib.abc, sys, warnings
    import torch, transformers
    import torch.utils._python_dispatch as dispatch
    del dispatch.is_in_torch_dispatch_mode  # as on a torch release without it
    folder, out_file = sys.argv[1:3]

    class NoFivefold(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "fivefold":
                raise ImportError("fivefold is not importable here")

    sys.meta_path.insert(0, blocker := NoFivefold())
    transformers.utils.logging.set_verbosity_error()
    inputs = torch.load(sys.argv[3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = transformers.AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        assert "fivefold" not in sys.modules
        with torch.no_grad():
            remote = [model(**inputs).last_hidden_state for _ in range(2)]
        sys.meta_path.remove(blocker)
        from fivefold.modeling.linear import Linear, ONEDNN_AVAILABLE
        assert not ONEDNN_AVAILABLE
        layer, x = Linear(768, 768), torch.randn(4, 768)
        with torch.no_grad():
            package = [layer(x), layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias)]
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "oneDNN" in str(w.message)]
    torch.save({"remote": remote, "package": package, "messages": messages}, out_file)
    """
)


@pytest.mark.slow  # a subprocess
def test_a_missing_symbol_falls_back_to_f_linear_with_one_warning(converted, tmp_path):
    """In a fresh interpreter whose torch lacks `is_in_torch_dispatch_mode`: a converted folder's remote code and
    the package's Linear both run, equal to the full path, and each copy of the module warns once."""
    _, folder = converted("bert", "BertModel")
    script = tmp_path / "hidden.py"
    script.write_text(HIDDEN_RUN)
    inputs = {
        "input_ids": torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]]),
        "attention_mask": torch.tensor([[1] * 4, [1, 1, 1, 0]]),
    }
    torch.save(inputs, tmp_path / "inputs.pt")
    run = subprocess.run(
        [sys.executable, str(script), str(folder), str(tmp_path / "out.pt"), str(tmp_path / "inputs.pt")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt")
    (bert,) = [a for a in ARCHITECTURES if a.stock_model_type == "bert"]
    with torch.no_grad():
        expected = bert.base_model.from_pretrained(folder).eval()(**inputs).last_hidden_state
    assert all((r - expected).abs().max() <= 1e-5 for r in out["remote"])
    first, second, reference = out["package"]
    assert torch.equal(first, reference) and torch.equal(second, reference)
    assert len(out["messages"]) == 2, out["messages"]  # the remote copy of linear.py and the package's: once each
    assert all("is_in_torch_dispatch_mode" in m for m in out["messages"])
