"""The class each architecture is trained or compared as in the multi-process tests."""

TASK_CLASSES = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "modernbert": "ModernBertForMaskedLM",
    "vit": "ViTForImageClassification",
    "gpt2": "GPT2LMHeadModel",
    "mixtral": "MixtralForCausalLM",
    "t5": "T5ForConditionalGeneration",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
