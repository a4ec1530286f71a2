"""A model built from a config (training from scratch) starts as stock's does: every tensor drawn with stock's
spread (T5's fan-in scales, GPT-2's and ModernBERT's smaller residual outputs, ModernBERT's truncated normals),
every constant (norms, biases, padding rows) equal."""

import pytest
import torch
import transformers

from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.verify import stock_values_of

CLASSES = [pytest.param(arch, cls, id=cls.__name__) for arch in ARCHITECTURES for cls in arch.models.values()]
NOISY = 256  # fewer values than this estimate a std too loosely to compare (T5's 8 x 4 relative bias)


@pytest.mark.parametrize(("arch", "cls"), CLASSES)
def test_fresh_weights_have_stocks_spread(arch, cls):
    config = transformers.AutoConfig.for_model(arch.stock_model_type, **arch.tiny, num_labels=3)
    torch.manual_seed(0)
    stock = getattr(transformers, stock_class_name(cls))(config)
    ours = cls(cls.config_class(**config.to_dict()))
    state = ours.state_dict()
    theirs = stock_values_of(arch, stock, cls, ours.config, set(state))
    for key, value in state.items():
        a, b = value.float(), theirs[key].float()
        if b.numel() > 1 and b.std() > 0:
            if b.numel() >= NOISY:
                assert 0.8 < float(a.std() / b.std()) < 1.25, key  # GPT-2's residual scale (1/2 here) fails
        else:
            assert torch.equal(a, b), key
