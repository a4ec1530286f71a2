"""Continuous batching (`generate_batch`, `generate(cache_implementation="paged")`, `transformers serve
--continuous-batching`) as transformers runs it, with no silent failure.

transformers' manager never raises: a request that fails ends with `.error` set and no tokens, and
`generate(cache_implementation="paged")` then returns the prompt alone. fivefold's `generate_batch` raises instead,
naming the failed requests and their errors. A model whose inputs the manager cannot build (an encoder-decoder: it
feeds decoder-only rows) refuses before the manager starts. The paged cache itself is read by the shared attention
(`cache.update(..., kwargs=...)`) and its masks by kernels.paged_masks.
"""

from typing import Any, ClassVar


class ContinuousBatching:
    """Mixed in ahead of `GenerationMixin` by task models that generate."""

    # None: the model runs under continuous batching; otherwise the reason it does not.
    continuous_batching_refusal: ClassVar[str | None] = None

    def init_continuous_batching(self, *args: Any, **kwargs: Any):
        if self.continuous_batching_refusal is not None:
            raise NotImplementedError(
                f"{type(self).__name__} cannot run continuous batching (generate_batch, "
                f'cache_implementation="paged", serve --continuous-batching): {self.continuous_batching_refusal}. '
                "Use generate() instead."
            )
        return super().init_continuous_batching(*args, **kwargs)

    def generate_batch(self, inputs: list[list[int]], *args: Any, **kwargs: Any) -> dict:
        """transformers' `generate_batch`, raising where a request failed rather than returning it empty."""
        outputs = super().generate_batch(inputs, *args, **kwargs)
        failed = {request: output.error for request, output in outputs.items() if output.error is not None}
        if failed:
            shown = "; ".join(f"{request}: {error}" for request, error in list(failed.items())[:3])
            raise RuntimeError(f"continuous batching failed for {len(failed)} of {len(outputs)} requests ({shown})")
        return outputs
