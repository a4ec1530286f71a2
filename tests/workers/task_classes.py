"""The class each architecture is trained or compared as in the multi-process tests."""

TASK_CLASSES = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "modernbert": "ModernBertForMaskedLM",
    "vit": "ViTForImageClassification",
    "gpt2": "GPT2LMHeadModel",
    "mixtral": "MixtralForCausalLM",
    "t5": "T5ForConditionalGeneration",
    "gpt_oss": "GptOssForCausalLM",
}
