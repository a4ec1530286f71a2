"""Loading options work as in transformers: dtype, device_map with offload (`"auto"` too), init of missing weights,
the options that pick a stock folder's files."""

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import fivefold
from fivefold.conversion.inputs import text_inputs
from fivefold.modeling.attention import AttentionSpec
from fivefold.modeling.block import Block, BlockSpec
from fivefold.modeling.feedforward import FeedForwardSpec


def test_dtype_and_offloaded_device_map(converted, tmp_path):
    _, dst = converted("bert", "BertForSequenceClassification")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(dst).eval()
    half = transformers.AutoModelForSequenceClassification.from_pretrained(dst, dtype=torch.bfloat16).eval()
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    device_map = {"model.embeddings": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.norm": "cpu", "model.pooler": "cpu", "classifier": "cpu"}  # fmt: skip
    offloaded = transformers.AutoModelForSequenceClassification.from_pretrained(
        dst, device_map=device_map, offload_folder=str(tmp_path / "offload")
    ).eval()
    assert offloaded.hf_device_map["model.layers.1"] == "disk"
    inputs = text_inputs(reference.config)
    with torch.no_grad():
        expected = reference(**inputs).logits
        assert (offloaded(**inputs).logits - expected).abs().max() <= 1e-5
        assert (half(**inputs).logits.float() - expected).abs().max() < 0.1


@pytest.mark.parametrize(
    ("model_type", "stock_name", "auto"),
    [
        ("gpt2", "GPT2LMHeadModel", "AutoModelForCausalLM"),
        ("t5", "T5ForConditionalGeneration", "AutoModelForSeq2SeqLM"),
    ],
)
def test_device_map_auto_places_a_model_with_tied_embeddings(converted, tmp_path, model_type, stock_name, auto):
    """transformers finds a tied weight's module by substring when it builds the map: no child may be named
    inside `lm_head`."""
    _, dst = converted(model_type, stock_name)
    reference = getattr(transformers, auto).from_pretrained(dst).eval()
    size = sum(p.numel() * p.element_size() for p in reference.parameters())
    placed = (
        getattr(transformers, auto)
        .from_pretrained(
            dst, device_map="auto", max_memory={"cpu": size // 2}, offload_folder=str(tmp_path / "offload")
        )
        .eval()
    )
    assert "disk" in placed.hf_device_map.values()
    if model_type == "t5":  # a relative-bias table accelerate keeps on meta until its lookup runs
        assert any("relative_bias" in name and where == "disk" for name, where in placed.hf_device_map.items())
    assert placed.get_output_embeddings().weight is placed.get_input_embeddings().weight
    ids = torch.tensor([[5, 17, 42, 8, 9]])
    extra = {"decoder_input_ids": ids[:, :3]} if model_type == "t5" else {}
    with torch.no_grad():
        assert (placed(input_ids=ids, **extra).logits - reference(input_ids=ids, **extra).logits).abs().max() <= 1e-5


def test_missing_head_is_initialised_by_role(converted):
    """A classifier head loaded from an MLM checkpoint is new: N(0, initializer_range) weights, zero bias;
    everything else comes from the checkpoint."""
    _, dst = converted("roberta", "RobertaForMaskedLM")
    model = fivefold.FivefoldRobertaForTokenClassification.from_pretrained(dst, num_labels=5)
    std = model.config.initializer_range
    weight = model.classifier.weight
    assert torch.isfinite(weight).all() and abs(weight.std().item() - std) < std * 0.5
    assert torch.count_nonzero(model.classifier.bias) == 0
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(dst)
    assert torch.equal(mlm.model.layers[1].attn.q_proj.weight, model.model.layers[1].attn.q_proj.weight)


def test_fresh_model_initialisation():
    config = fivefold.FivefoldBertConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    model = fivefold.FivefoldBertForMaskedLM(config)
    words = model.model.embeddings.word_embeddings.weight
    assert torch.count_nonzero(words[config.pad_token_id]) == 0
    assert abs(words.std().item() - config.initializer_range) < 0.005
    norm = model.model.layers[0].norm_after_attn
    assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and torch.count_nonzero(norm.bias) == 0
    assert model.lm_head.decoder.weight is words  # tied


def test_prenorm_block_places_norms_before_each_sublayer():
    """The same block in pre-norm placement: x + attn(norm(x)), then h + mlp(norm(h)); no norm after."""
    config = fivefold.FivefoldBertConfig(hidden_size=16, num_attention_heads=2)
    spec = BlockSpec(
        attention=AttentionSpec(hidden_size=16, num_heads=2),
        feedforward=FeedForwardSpec("dense", 16, 24, "gelu"),
        norm="layernorm",
        norm_eps=1e-5,
        prenorm=True,
    )
    block = Block(config, spec, layer_idx=0).eval()
    assert isinstance(block.norm_after_attn, torch.nn.Identity) and isinstance(block.norm_after_mlp, torch.nn.Identity)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        x = torch.randn(2, 5, 16)
        h = x + block.attn(block.norm_before_attn(x))[0]
        expected = h + block.mlp(block.norm_before_mlp(h))
        assert (block(x) - expected).abs().max() < 1e-6


def test_a_fivefold_folder_of_another_architecture_is_refused(converted, stock_checkpoint):
    """As for stock folders: one clear error naming both, not random weights with transformers' warning."""
    _, bert_folder = converted("bert", "BertForMaskedLM")
    for folder in (bert_folder, stock_checkpoint("bert", "BertForMaskedLM")):
        with pytest.raises(fivefold.ConversionError, match=r"is a (fivefold_)?bert checkpoint; .* loads fivefold_gpt2"):
            fivefold.FivefoldGPT2LMHeadModel.from_pretrained(folder)


def test_a_stock_folder_loads_with_transformers_file_options(stock_checkpoint, tmp_path):
    """`variant`, `key_mapping` and `use_safetensors` pick and rename a stock folder's files for fivefold's class
    as they do for stock's, before the conversion in memory."""
    stock = transformers.LlamaForCausalLM.from_pretrained(stock_checkpoint("llama", "LlamaForCausalLM")).eval()
    ids = torch.tensor([[5, 17, 42, 8, 9]])
    with torch.no_grad():
        expected = stock(input_ids=ids).logits
    stock.save_pretrained(tmp_path / "variant", variant="v1")
    prefixed = tmp_path / "prefixed"
    stock.save_pretrained(prefixed)
    state = {f"backbone.{k}": v for k, v in load_file(prefixed / "model.safetensors").items()}
    save_file(state, prefixed / "model.safetensors", metadata={"format": "pt"})

    cls = fivefold.FivefoldLlamaForCausalLM
    for folder, options in (
        (tmp_path / "variant", {"variant": "v1"}),
        (prefixed, {"key_mapping": {r"^backbone\.": ""}}),
    ):
        ours = cls.from_pretrained(folder, **options).eval()
        with torch.no_grad():
            assert (ours(input_ids=ids).logits - expected).abs().max() <= 1e-5
    with pytest.raises(fivefold.ConversionError, match=r"expected pytorch_model\.bin"):  # stock: an OSError
        cls.from_pretrained(prefixed, use_safetensors=False, key_mapping={r"^backbone\.": ""})


@pytest.mark.parametrize(
    ("model_type", "stock_name"), [("llama", "LlamaForCausalLM"), ("mixtral", "MixtralForCausalLM")]
)
def test_stored_rotary_frequencies_are_recomputed(stock_checkpoint, tmp_path, model_type, stock_name):
    """Files written before transformers stopped saving the rotary buffer hold `rotary_emb.inv_freq` per layer,
    which stock drops silently: so do convert and the direct load."""
    src = tmp_path / "stock"
    stock = getattr(transformers, stock_name).from_pretrained(stock_checkpoint(model_type, stock_name)).eval()
    stock.save_pretrained(src)
    state = load_file(src / "model.safetensors")
    dim = stock.config.hidden_size // stock.config.num_attention_heads
    for i in range(stock.config.num_hidden_layers):
        state[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = torch.rand(dim // 2)
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    ids = torch.tensor([[5, 17, 42, 8, 9]])
    arch = fivefold.architectures.architecture_for_model_type(model_type)
    converted = transformers.AutoModelForCausalLM.from_pretrained(
        fivefold.convert(src, tmp_path / "ff", progress=False)
    )
    with torch.no_grad():
        expected = getattr(transformers, stock_name).from_pretrained(src).eval()(input_ids=ids).logits
        for ours in (converted.eval(), arch.class_named(stock_name).from_pretrained(src).eval()):
            assert (ours(input_ids=ids).logits - expected).abs().max() <= 1e-5


def test_a_broken_folder_is_named_as_the_user_named_it(converted, stock_checkpoint, tmp_path):
    """Loads read a local folder through one open handle (`/proc/self/fd/N`, pinned_folder.py); the errors name the
    folder the user gave, as stock's do."""
    _, dst = converted("llama", "LlamaForCausalLM")
    sharded = tmp_path / "sharded"
    transformers.AutoModelForCausalLM.from_pretrained(dst).save_pretrained(sharded, max_shard_size="20KB")
    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(OSError) as missing_shard:
        transformers.AutoModelForCausalLM.from_pretrained(sharded)
    with pytest.raises(OSError) as missing_variant:
        transformers.AutoModelForCausalLM.from_pretrained(dst, variant="fp16")
    src = stock_checkpoint("llama", "LlamaForCausalLM")
    with pytest.raises(fivefold.ConversionError) as stock_variant:
        fivefold.FivefoldLlamaForCausalLM.from_pretrained(src, variant="fp16")
    for error, folder in ((missing_shard, sharded), (missing_variant, dst), (stock_variant, src)):
        assert "/proc/self/fd" not in str(error.value) and str(folder) in str(error.value)


def test_a_config_with_fewer_layers_takes_the_first_layers_of_a_stock_folder(stock_checkpoint):
    """`from_pretrained(folder, config=...)` with fewer layers than the checkpoint: stock keeps the first ones and
    reports the others as unexpected; so does the fivefold class on the stock folder (converted as the checkpoint's
    own config lays it out)."""
    src = stock_checkpoint("llama", "LlamaForCausalLM")
    shallow = transformers.AutoConfig.from_pretrained(src, num_hidden_layers=1)
    stock, info = transformers.LlamaForCausalLM.from_pretrained(src, config=shallow, output_loading_info=True)
    ours_config = fivefold.FivefoldLlamaConfig.from_pretrained(src, num_hidden_layers=1)
    ours, our_info = fivefold.FivefoldLlamaForCausalLM.from_pretrained(
        src, config=ours_config, output_loading_info=True
    )
    assert len(ours.model.layers) == 1 and info["unexpected_keys"] and our_info["unexpected_keys"]
    assert not our_info["missing_keys"]
    ids = torch.tensor([[5, 17, 42, 8, 9]])
    with torch.no_grad():
        assert (ours.eval()(input_ids=ids).logits - stock.eval()(input_ids=ids).logits).abs().max() <= 1e-5


def test_the_loading_report_names_the_folder_given(converted, stock_checkpoint):
    """transformers' `LOAD REPORT from: ...` (a head new to the checkpoint) names the user's folder, for a converted
    folder (read through a pinned handle) and a stock one converted in memory (no folder handed to transformers)."""
    import io
    import logging

    src, dst = converted("bert", "BertForMaskedLM")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = transformers.utils.logging.get_logger("transformers")
    logger.addHandler(handler)
    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_warning()
    try:
        transformers.AutoModelForSequenceClassification.from_pretrained(dst)
        fivefold.FivefoldBertForSequenceClassification.from_pretrained(src)
    finally:
        logger.removeHandler(handler)
        transformers.utils.logging.set_verbosity(verbosity)
    reports = [line for line in stream.getvalue().splitlines() if "LOAD REPORT" in line]
    assert len(reports) == 2
    assert reports[0].endswith(f"from: {dst}") and reports[1].endswith(f"from: {src}")
