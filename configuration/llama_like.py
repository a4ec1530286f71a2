"""What the configs of the Llama-like decoders share (modeling/llama_like.py builds their models): the checks
of their fields and their parallelism plans."""

from .base import FivefoldConfigMixin
from .parallel import DECODER_PIPELINE_PLAN, tensor_parallel_plan
from .validation import check_llama_like, check_positive


class LlamaLikeConfigMixin(FivefoldConfigMixin):
    # Stock's plans name stock's modules (`self_attn.q_proj`); these name fivefold's.
    base_model_tp_plan = tensor_parallel_plan("")
    base_model_pp_plan = DECODER_PIPELINE_PLAN

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_llama_like(self)
        check_positive(self, "intermediate_size")
