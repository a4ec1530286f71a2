"""A converted GPT-2 loads with stock transformers and trust_remote_code=True where fivefold cannot be imported,
and generates the stock model's tokens (GenerationMixin is in the shipped class's MRO)."""

import subprocess
import sys
import textwrap

import torch
import transformers

from fivefold.conversion.inputs import causal_text_sample

REMOTE_GENERATE = textwrap.dedent(
    """
    import importlib.abc, sys
    sys.path = [p for p in sys.path if p not in ("", ".") and "fivefold" not in p and not p.endswith("/main")]

    class NoFivefold(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "fivefold":
                raise ImportError("fivefold is not importable in this process")

    sys.meta_path.insert(0, NoFivefold())
    import torch, transformers
    transformers.utils.logging.set_verbosity_error()
    folder, inputs_file, out_file = sys.argv[1:4]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert "fivefold" not in sys.modules
    assert isinstance(model, transformers.GenerationMixin)
    inputs = torch.load(inputs_file)
    tokens = model.generate(**inputs, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    torch.save({"cls": type(model).__name__, "module": type(model).__module__, "tokens": tokens}, out_file)
    """
)


def test_converted_gpt2_generates_as_remote_code(converted, tmp_path):
    src, dst = converted("gpt2", "GPT2LMHeadModel")
    stock = transformers.GPT2LMHeadModel.from_pretrained(src).eval()
    inputs = causal_text_sample(stock.config, "GPT2LMHeadModel")
    torch.save(inputs, tmp_path / "inputs.pt")
    script = tmp_path / "remote_generate.py"
    script.write_text(REMOTE_GENERATE)
    command = [sys.executable, str(script), str(dst), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    remote = torch.load(tmp_path / "out.pt")
    assert remote["cls"] == "FivefoldGPT2LMHeadModel" and remote["module"].startswith("transformers_modules.")
    expected = stock.generate(**inputs, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    assert torch.equal(remote["tokens"], expected)
