"""`experts_implementation` is honoured or refused, never accepted and ignored: fivefold runs every expert as its own
linear layers (eager), on every architecture of the table; every other value stock knows is refused by name, at
load and when switched later."""

import pytest

from fivefold.architectures import ARCHITECTURES, stock_class_name

REFUSED = ["batched_mm", "grouped_mm"]


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.stock_model_type)
def test_eager_loads_and_stock_kernels_are_refused(arch, converted):
    cls = next(iter(arch.models.values()))
    _, folder = converted(arch.stock_model_type, stock_class_name(cls))
    model = cls.from_pretrained(folder, experts_implementation="eager")
    assert model.config._experts_implementation == "eager"
    assert cls.from_pretrained(folder).config._experts_implementation == "eager"  # unset means eager
    for value in REFUSED:
        with pytest.raises(ValueError, match=f"does not support experts_implementation='{value}'.*Supported: 'eager'"):
            cls.from_pretrained(folder, experts_implementation=value)
        with pytest.raises(ValueError, match=f"experts_implementation='{value}'"):
            model.set_experts_implementation(value)
    assert model.config._experts_implementation == "eager"
