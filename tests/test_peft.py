"""PEFT: `LoraConfig(task_type=...)` without target_modules adapts fivefold's default targets on every architecture
(registered on `import fivefold`, whichever of PEFT and fivefold is imported first) and trains; the router and
single experts are reachable by target_modules."""

import pytest
import torch

from fivefold import peft_defaults
from fivefold.after_import import AfterImport
from fivefold.architectures import ARCHITECTURES, stock_class_name

peft = pytest.importorskip("peft")  # in the test extras

# The task type PEFT wraps each head in; the first one an architecture has is tested.
TASKS = {
    "AutoModelForSequenceClassification": "SEQ_CLS",
    "AutoModelForCausalLM": "CAUSAL_LM",
    "AutoModelForSeq2SeqLM": "SEQ_2_SEQ_LM",
    "AutoModel": "FEATURE_EXTRACTION",
}


def _model(arch, auto: str):
    torch.manual_seed(0)
    config = arch.config_class(**arch.tiny)
    cls = arch.models[auto]
    return cls(config), arch.sample_inputs(config, stock_class_name(cls), 0)


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.stock_model_type)
def test_lora_without_targets_trains(arch):
    auto = next(a for a in TASKS if a in arch.models)
    model, inputs = _model(arch, auto)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, task_type=TASKS[auto]))
    adapted = {name.rsplit(".", 1)[-1] for name, module in lora.named_modules() if hasattr(module, "lora_A")}
    assert adapted == set(arch.lora_targets)

    def loss():  # the first output against fixed random targets: no normalised output is a constant here
        out = next(v for v in lora(**inputs).values() if torch.is_tensor(v) and v.is_floating_point()).float()
        return (out - torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).pow(2).mean()

    lora.train()
    before = loss()
    before.backward()
    trainable = [(n, p) for n, p in lora.named_parameters() if p.requires_grad and "lora_" in n]
    assert trainable and all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in trainable if "lora_B" in n)
    torch.optim.SGD([p for _, p in trainable], lr=0.1).step()
    assert not torch.allclose(loss(), before)


def test_router_and_one_expert_by_target_modules():
    arch = next(a for a in ARCHITECTURES if a.stock_model_type == "mixtral")
    model, _ = _model(arch, "AutoModelForCausalLM")
    targets = [["router"], r".*experts\.1\.(gate_proj|up_proj|down_proj)"]  # a list: names; a string: a regex
    for target in targets:
        lora = peft.get_peft_model(_model(arch, "AutoModelForCausalLM")[0], peft.LoraConfig(r=2, target_modules=target))
        adapted = [name for name, module in lora.named_modules() if hasattr(module, "lora_A")]
        assert adapted, target
        if target == ["router"]:
            assert all(name.endswith("mlp.router") for name in adapted)
            assert len(adapted) == model.config.num_hidden_layers
        else:
            assert all(".experts.1." in name for name in adapted)
            assert len(adapted) == 3 * model.config.num_hidden_layers


def test_defaults_added_when_peft_is_imported_after_fivefold():
    """PEFT loaded after `import fivefold` gets the rows too: its constants module, run afresh through the finder
    `import fivefold` installs when PEFT is not loaded yet, holds them (here PEFT came first: rows added at once)."""
    import importlib.util

    import peft.utils

    finder = AfterImport("peft.utils.constants", peft_defaults.add_rows)
    spec = finder.find_spec("peft.utils.constants", peft.utils.__path__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    table = fresh.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    assert table is not peft.utils.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    assert {k: v for k, v in table.items() if k.startswith("fivefold_")} == peft_defaults.lora_target_modules()
    assert table["bert"] == ["query", "value"]  # PEFT's own rows untouched
