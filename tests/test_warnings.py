"""fivefold's own warnings as transformers gives stock's: the same message where stock's kernel would give it, and
under transformers' logger, whose verbosity (`transformers.logging.set_verbosity_error()`) silences them."""

import pytest
import torch
import transformers
from transformers.testing_utils import CaptureLogger

from fivefold.architectures import architecture_for_model_type
from fivefold.modeling import decoder, kernel_warnings


@pytest.fixture
def fresh_warnings():
    """Warnings shown (the suite's conftest silences them), and `warning_once`, which remembers what it said in this
    process, starting with nothing said."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    decoder.logger.warning_once.cache_clear()
    yield
    decoder.logger.warning_once.cache_clear()
    transformers.logging.set_verbosity(verbosity)


def _model(converted, stock_name: str, attn: str, model_type: str = "llama"):
    _, dst = converted(model_type, stock_name)
    arch = architecture_for_model_type(model_type)
    return arch.class_named(stock_name).from_pretrained(dst, attn_implementation=attn)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(("model_type", "stock_name"), [("llama", "LlamaForCausalLM"), ("bert", "BertModel")])
def test_attentions_asked_of_sdpa_warn_as_stocks_kernel_does(converted, fresh_warnings, model_type, stock_name, attn):
    """A decoder keeps the request from its kernels, and a padded batch of an encoder runs fivefold's own kernel
    over the unpadded tokens: where stock's sdpa kernel would warn, fivefold does."""
    model = _model(converted, stock_name, attn, model_type).eval()
    inputs = {
        "input_ids": torch.tensor([[5, 17, 42, 8], [6, 7, 0, 0]]),
        "attention_mask": torch.tensor([[1] * 4, [1, 1, 0, 0]]),
    }
    with CaptureLogger(kernel_warnings.logger) as captured, torch.no_grad():
        out = model(**inputs, output_attentions=True)
    warned = "`sdpa` attention does not support `output_attentions=True`" in captured.out
    assert warned == (attn == "sdpa") and len(out.attentions) == (0 if attn == "sdpa" else 2)


def test_transformers_verbosity_silences_fivefolds_warnings(converted, fresh_warnings):
    model = _model(converted, "LlamaForSequenceClassification", "sdpa").eval()
    embeds = model.get_input_embeddings()(torch.tensor([[5, 17, 42, 8]]))
    for level, heard in ((transformers.logging.WARNING, True), (transformers.logging.ERROR, False)):
        transformers.logging.set_verbosity(level)
        decoder.logger.warning_once.cache_clear()
        with CaptureLogger(decoder.logger) as captured, torch.no_grad():
            model(inputs_embeds=embeds)
        assert ("will not detect padding tokens in `inputs_embeds`" in captured.out) == heard
