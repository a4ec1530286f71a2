"""Conversion at the public sizes, on the meta device (no memory used), for every public checkpoint of every
architecture in the table and every class it supports: every stock tensor accounted for, every tensor of ours
produced with the right shape, as many parameters as stock's. The layouts of older files (legacy names, stored
buffers, per-file quirks) are tested in the architecture's own file."""

import pytest

from fivefold.architectures import ARCHITECTURES, stock_class_name

from helpers import plan_on_meta, public_stock_model, shapes_on_disk, stock_parameters

CASES = [
    pytest.param(arch, hub_id, stock_class_name(cls), id=f"{hub_id}-{stock_class_name(cls)}")
    for arch in ARCHITECTURES
    for hub_id in arch.public
    for cls in arch.models.values()
]


def test_every_architecture_has_a_public_checkpoint():
    assert all(arch.public for arch in ARCHITECTURES)


@pytest.mark.slow  # 81 conversions at public sizes: 33 s
@pytest.mark.parametrize(("arch", "hub_id", "stock_name"), CASES)
def test_public_size_conversion_is_complete(arch, hub_id, stock_name):
    stock = public_stock_model(arch, arch.public[hub_id], stock_name)
    shapes = shapes_on_disk(stock)
    meta = plan_on_meta(arch, stock, shapes)

    assert meta.accounted == set(shapes)
    assert not meta.plan.dropped  # what save_pretrained writes today holds nothing to drop
    assert meta.produced == meta.expected
    assert meta.parameters == stock_parameters(stock)
