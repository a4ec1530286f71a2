"""Pipeline parallelism: a decoder's causal LM is split over 2 gloo processes (one stage's layers each) and equals one
process; every other class of the table is refused at load, before any forward, rather than split wrongly."""

import pytest
import torch
from launching import launch

from fivefold.architectures import ARCHITECTURES
from fivefold.modeling.pipeline import check_pipeline_parallel

CLASSES = [(arch, cls) for arch in ARCHITECTURES for cls in arch.models.values()]
SPLIT = {cls.__name__ for arch, cls in CLASSES if cls._pp_plan and arch.config_class.base_model_pp_plan}


@pytest.mark.parametrize("arch,cls", CLASSES, ids=lambda c: getattr(c, "__name__", ""))
def test_classes_without_a_pipeline_plan_are_refused(arch, cls):
    with torch.device("meta"):
        model = cls(arch.config_class(**arch.tiny))
    assert cls.__name__ not in SPLIT or model.supports_pp_plan
    if cls.__name__ in SPLIT:
        check_pipeline_parallel(model)
    else:
        with pytest.raises(ValueError, match=f"{cls.__name__} does not support pipeline parallelism"):
            check_pipeline_parallel(model)


@pytest.mark.slow
def test_pipeline_parallel_equals_one_process_or_is_refused(tmp_path):
    assert {"FivefoldGPT2LMHeadModel", "FivefoldMixtralForCausalLM"} <= SPLIT
    results = launch("pipeline_parallel", 2, tmp_path, {}, timeout=600)
    for result in results:
        assert len(result) == len(ARCHITECTURES)  # one class of each, a decoder's causal LM
        assert SPLIT & set(result)
        for name, r in result.items():
            if name not in SPLIT:
                assert "does not support pipeline parallelism" in r["refused"], (name, r)
                continue
            assert r["refused"] is None, (name, r)
            assert r["layers"] < 2, (name, r)  # each stage holds its own share of the layers
            assert r["logits"] <= 1e-5, (name, r)
            assert r["same_tokens"], (name, r)
            assert "split into pipeline stages" in r["save"] and not r["save_wrote"], (name, r)
