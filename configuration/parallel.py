"""Tensor-parallel plans (`base_model_tp_plan`, read by `DistributedConfig(tp_size=N)`): as stock's plans do,
q/k/v and the gate/up projections split column-wise (each rank keeps its own heads and inner units), the attention
output and down projections row-wise (partial sums all-reduced). Plain data: module name patterns (`*` a layer or
expert number) to transformers' style names, plus one style of fivefold's own (modeling/parallel.py)."""

ATTENTION = {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "o_proj": "rowwise"}
FEEDFORWARD = {"gate_proj": "colwise", "up_proj": "colwise", "down_proj": "rowwise"}
# Where a part needs every head on every rank (a q/k RMSNorm across the whole projection, OLMoE; per-head attention
# sinks, gpt-oss): q/k/v split by columns and gathered, the output projection splitting its (whole) input, as stock's
# OLMoE plan does. Each rank computes the attention of all heads.
GATHERED_ATTENTION = {
    "q_proj": "colwise_gather_output",
    "k_proj": "colwise_gather_output",
    "v_proj": "colwise_gather_output",
    "o_proj": "rowwise_split_input",
}
# T5's relative position bias has one column per head: each rank keeps the columns of its own heads.
HEAD_COLUMNS = "fivefold_head_columns"  # registered by fivefold.modeling.parallel


def tensor_parallel_plan(
    *stacks: str,
    cross_attention: bool = False,
    experts: bool = False,
    relative_bias: bool = False,
    attention: dict[str, str] = ATTENTION,
) -> dict[str, str]:
    """The plan for blocks under each of `stacks` ("layers", or "encoder"/"decoder" for T5)."""
    plan = {}
    for stack in stacks:
        blocks = f"{stack}.layers.*" if stack else "layers.*"
        attentions = ("attn", "cross_attn") if cross_attention and stack == "decoder" else ("attn",)
        for module in attentions:
            plan |= {f"{blocks}.{module}.{name}": style for name, style in attention.items()}
        # A mixture's experts, and the dense layers and shared expert some mixtures have beside them (a model keeps
        # the rules that name its modules: pretrained.py).
        mlps = (
            [f"{blocks}.mlp.experts.*", f"{blocks}.mlp", f"{blocks}.mlp.shared_expert.expert"]
            if experts
            else [f"{blocks}.mlp"]
        )
        plan |= {f"{mlp}.{name}": style for mlp in mlps for name, style in FEEDFORWARD.items()}
        if relative_bias:
            plan[f"{stack}.relative_bias.relative_attention_bias"] = HEAD_COLUMNS
    return plan


# Pipeline parallelism (`DistributedConfig(pp_size=N)`, modeling/pipeline.py): what each part of a decoder's stack
# takes and gives, as stock declares `base_model_pp_plan` (fivefold's embeddings are `embeddings`, not `embed_tokens`).
DECODER_PIPELINE_PLAN = {
    "embeddings": (["input_ids"], ["inputs_embeds"]),
    "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
    "norm": (["hidden_states"], ["hidden_states"]),
}
