"""Invariants of the shared parts and the conversion machinery."""

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError

import fivefold
from fivefold.conversion import ConversionError
from fivefold.conversion.inputs import text_inputs
from fivefold.conversion.keymap import TRANSFORMS, KeyMap, Rule, renames
from fivefold.modeling.attention import Attention, AttentionSpec
from fivefold.modeling.feedforward import FeedForwardSpec
from fivefold.modeling.norms import RMSNorm, build_norm
from fivefold.modeling.parts import build_feedforward


def test_rmsnorm_matches_torch():
    x = torch.randn(2, 5, 16)
    ours, ref = RMSNorm(16, eps=1e-6), torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_()
        ref.weight.copy_(ours.weight)
    assert (ours(x) - ref(x)).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("build", "kind"),
    [
        (lambda k: build_norm(k, 8, 1e-5), "batchnorm"),
        (lambda k: build_feedforward(FeedForwardSpec(k, 8, 16, "gelu")), "moe?"),
    ],
)
def test_registries_name_the_valid_keys(build, kind):
    with pytest.raises(ValueError, match="valid: "):
        build(kind)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_kernels_agree(causal):
    """eager == sdpa, with a padding mask and without; causal via `is_causal` == causal via an explicit mask."""
    config = fivefold.FivefoldBertConfig(hidden_size=32, num_attention_heads=4)
    spec = AttentionSpec(hidden_size=32, num_heads=4, num_kv_heads=2, is_causal=causal)
    attn = Attention(config, spec, layer_idx=0).eval()
    x = torch.randn(2, 7, 32)
    outs = {}
    for impl in ("eager", "sdpa"):
        config._attn_implementation = impl
        outs[impl] = attn(x, None)[0]
    assert (outs["eager"] - outs["sdpa"]).abs().max() < 1e-5
    keep = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    if causal:
        keep = keep.tril()
    keep[1, :, :, 5:] = False
    config._attn_implementation = "eager"
    eager_masked = attn(x, keep)[0]
    config._attn_implementation = "sdpa"
    assert (attn(x, keep)[0] - eager_masked).abs().max() < 1e-5
    if causal:  # sdpa's is_causal (no mask) equals an explicit lower-triangular mask under eager
        config._attn_implementation = "eager"
        explicit = torch.ones(2, 1, 7, 7, dtype=torch.bool).tril()
        assert (attn(x, explicit)[0] - outs["sdpa"]).abs().max() < 1e-5


def test_our_eager_equals_our_sdpa_on_a_model(converted):
    _, dst = converted("roberta", "RobertaForMaskedLM")
    eager = transformers.AutoModelForMaskedLM.from_pretrained(dst, attn_implementation="eager").eval()
    sdpa = transformers.AutoModelForMaskedLM.from_pretrained(dst, attn_implementation="sdpa").eval()
    inputs = text_inputs(eager.config)
    real = inputs["attention_mask"].bool()  # sdpa runs unpadded: padded positions differ
    with torch.no_grad():
        assert (eager(**inputs).logits - sdpa(**inputs).logits)[real].abs().max() < 1e-5
    sdpa.set_attn_implementation("eager")  # switchable at run time, as transformers expects
    assert sdpa.config._attn_implementation == "eager"


def test_gradient_checkpointing_gives_the_same_gradients(converted):
    _, dst = converted("bert", "BertForMaskedLM")
    inputs = text_inputs(transformers.AutoConfig.from_pretrained(dst))
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    grads, block_calls = [], []
    for checkpointing in (False, True):
        model = transformers.AutoModelForMaskedLM.from_pretrained(
            dst, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        ).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert model.is_activation_checkpointing
        calls = []
        for layer in model.model.layers:
            layer.mlp.register_forward_hook(lambda *args, calls=calls: calls.append(1))
        model(**inputs, labels=labels).loss.backward()
        block_calls.append(len(calls))
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    # checkpointing re-runs each block's forward during backward: the memory saving really happens
    assert block_calls == [2, 4]
    assert grads[0].keys() == grads[1].keys()
    assert max((grads[0][k] - grads[1][k]).abs().max() for k in grads[0]) < 1e-6


def test_resized_embeddings_accept_new_ids(converted):
    _, dst = converted("bert", "BertForMaskedLM")
    model = transformers.AutoModelForMaskedLM.from_pretrained(dst).eval()
    model.resize_token_embeddings(model.config.vocab_size + 6)
    logits = model(input_ids=torch.tensor([[2, model.config.vocab_size - 1]])).logits
    assert logits.shape[-1] == model.config.vocab_size


def test_tied_decoder_is_shared(converted):
    _, dst = converted("bert", "BertForMaskedLM")
    model = transformers.AutoModelForMaskedLM.from_pretrained(dst)
    assert model.lm_head.decoder.weight is model.model.embeddings.word_embeddings.weight


def test_auto_classes_are_registered():
    from fivefold.architectures import ARCHITECTURES

    for arch in ARCHITECTURES:
        config = transformers.AutoConfig.for_model(arch.model_type, **arch.tiny)
        assert type(config) is arch.config_class
        for auto_name, cls in arch.models.items():
            model = getattr(transformers, auto_name).from_config(config)
            assert type(model) is cls


def test_config_accepts_stock_fields_and_rejects_inconsistent_ones():
    stock = transformers.BertConfig(hidden_size=64, num_attention_heads=8, classifier_dropout=0.3).to_dict()
    ours = fivefold.FivefoldBertConfig.from_dict(stock)
    assert ours.model_type == "fivefold_bert" and ours.classifier_dropout == 0.3
    assert ours.to_dict()["model_type"] == "fivefold_bert"
    # transformers wraps config validation errors; the message names the fields
    with pytest.raises(StrictDataclassClassValidationError, match="num_attention_heads"):
        fivefold.FivefoldBertConfig(hidden_size=64, num_attention_heads=7)
    with pytest.raises(StrictDataclassClassValidationError, match="pad_token_id"):
        fivefold.FivefoldRobertaConfig(max_position_embeddings=2, pad_token_id=1)


def test_keymap_transforms_round_trip():
    rules = [Rule(("blocks.{}.qkv",), ("layers.{}.q", "layers.{}.k", "layers.{}.v"), "split3")]
    keymap = KeyMap(rules, renames({"head": "lm_head", "buffer": None}))
    source = {
        "m.blocks.0.qkv.weight": torch.randn(6, 4),
        "m.blocks.1.qkv.bias": torch.randn(6),
        "head.weight": torch.randn(2, 2),
        "buffer": torch.zeros(1),
    }
    plan = keymap.plan(source, "m", "model")
    assert plan.dropped == ["buffer"]
    assert plan.target_shapes({k: tuple(v.shape) for k, v in source.items()})["model.layers.1.v.bias"] == (2,)
    ours = {}
    for step in plan.steps:
        ours.update(plan.run(step, source.__getitem__))
    expected = {f"model.layers.0.{p}.weight" for p in "qkv"} | {f"model.layers.1.{p}.bias" for p in "qkv"}
    assert set(ours) == expected | {"lm_head.weight"}
    back = keymap.plan(ours, "m", "model", inverse=True)
    restored = {}
    for step in back.steps:
        restored.update(back.run(step, ours.__getitem__))
    assert set(restored) == set(source) - {"buffer"}
    assert all(torch.equal(restored[k], source[k]) for k in restored)
    assert TRANSFORMS["transpose"].apply([torch.zeros(2, 3), torch.zeros(3)])[0].shape == (3, 2)


def test_keymap_reports_unknown_and_incomplete_groups():
    keymap = KeyMap([Rule(("a.{}", "b.{}"), ("ab.{}",), "concat2")])
    with pytest.raises(ConversionError, match="match no conversion rule: zzz"):
        keymap.plan(["a.0.weight", "b.0.weight", "zzz"], "", "")
    with pytest.raises(ConversionError, match=r"incomplete tensor group: missing b\.1\.weight"):
        keymap.plan(["a.1.weight"], "", "")


def test_lora_configs_match_the_conventional_names(converted):
    """Users' LoRA configs (target_modules=["q_proj", "v_proj"], or "all-linear") find fivefold's layers."""
    import peft  # in the test extras

    _, dst = converted("bert", "BertForSequenceClassification")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(dst)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS"))
    adapted = {name.split(".")[-1] for name, module in lora.named_modules() if hasattr(module, "lora_A")}
    assert adapted == {"q_proj", "v_proj"}
    inputs = text_inputs(model.config)
    lora(**inputs, labels=torch.tensor([0, 1, 1])).loss.backward()
    trainable = [p for p in lora.parameters() if p.requires_grad]
    assert trainable and all(p.grad is not None for p in trainable if p.dim() == 2)


def test_lora_all_linear_adapts_the_router_and_records_what_routed(converted):
    """The router is a linear layer, so "all-linear" adapts it as it does stock Mixtral's; the router logits
    recorded for the auxiliary loss are the adapted ones that routed the tokens."""
    import peft

    _, dst = converted("mixtral", "MixtralForCausalLM")
    model = transformers.AutoModelForCausalLM.from_pretrained(dst)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    routers = [m for name, m in lora.named_modules() if name.endswith("mlp.router") and hasattr(m, "lora_A")]
    assert len(routers) == model.config.num_hidden_layers
    for router in routers:  # a non-zero adaptation, so that adapted and plain logits differ
        torch.nn.init.normal_(router.lora_B["default"].weight)
    used = []  # (router, its input, the adapted logits it returned)
    hooks = [r.register_forward_hook(lambda m, args, out: used.append((m, args[0], out))) for r in routers]
    ids = torch.randint(3, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    out = lora(input_ids=ids, labels=ids, output_router_logits=True)
    for hook in hooks:
        hook.remove()
    assert len(out.router_logits) == len(used) == len(routers)
    for recorded, (router, x, adapted) in zip(out.router_logits, used, strict=True):
        assert torch.equal(recorded, adapted)
        assert not torch.allclose(router.base_layer(x), adapted)
    out.loss.backward()
    assert all(r.lora_A["default"].weight.grad is not None for r in routers)


def test_rotary_matches_stock_and_survives_meta_loading():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralRotaryEmbedding, apply_rotary_pos_emb

    from fivefold.modeling.rotary import RotaryEmbedding, RotaryPositions

    config = MixtralConfig(
        hidden_size=64, num_attention_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 5e4}
    )
    position_ids = torch.tensor([[0, 1, 2, 7, 100], [3, 4, 5, 6, 1000]])
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    stock_cos, stock_sin = MixtralRotaryEmbedding(config)(q, position_ids)
    cos, sin = RotaryEmbedding(16, 5e4)(position_ids, torch.float32)
    assert torch.equal(cos, stock_cos) and torch.equal(sin, stock_sin)
    ours = RotaryPositions()(q, k, (cos, sin))
    for a, b in zip(ours, apply_rotary_pos_emb(q, k, stock_cos, stock_sin), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    with torch.device("meta"):
        table = RotaryEmbedding(16, 5e4)
    table.to_empty(device="cpu")
    model = fivefold.FivefoldBertModel(fivefold.FivefoldBertConfig(**fivefold.conversion.bert.TINY_TEXT_ENCODER))
    model._init_weights(table)
    torch.testing.assert_close(table.inv_freq, RotaryEmbedding(16, 5e4).inv_freq)


def test_gated_feedforward_is_act_of_gate_times_up():
    spec = FeedForwardSpec("gated", hidden_size=8, intermediate_size=12, activation="silu", bias=False)
    mlp = build_feedforward(spec)
    x = torch.randn(2, 3, 8)
    expected = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(mlp(x), expected)
