"""Attention kernels and the masks each one reads. Every kernel quirk of the project lives in this file.

Kernels: `eager_attention` (fivefold's reference: matmul, mask, fp32 softmax, dropout; the one that returns
attention weights), transformers' kernels under `config._attn_implementation` (sdpa, flash, flex, registered
ones), and `packed_attention` for packed sequences, which takes a `PackedSequences` in place of a mask.

Masks: one builder per kind of stack (bidirectional, causal with a cache, T5's additive relative bias), each
returning the mask in the form the selected kernel reads: transformers' mask functions for its kernels, bool or
additive float masks for eager, `PackedSequences` for packed sequences.

Quirks: sdpa treats a module without `is_causal` as causal (attention sets it); transformers' flash kernels
count a window of w as w - 1 positions on each side, so they get `window + 1`; a causal stack's sliding window
is read by transformers from `config.sliding_window`, which its sliding caches are sized by too; only sdpa and
flash run packed sequences (eager returns weights, flex builds block masks); a decoding step of one token sees
every cached key, so its mask is the padding mask alone. Attention sinks (`s_aux`, gpt-oss) join the softmax in
eager and in `sink_sdpa_attention` (a zero key whose score is the sink; exporters get eager, as sdpa given a mask
that needs gradients fails torch.export's dynamic shapes and ONNX), and go to transformers' flex and flash kernels,
which read them; any other kernel would drop them, so it is refused.

Shapes: B batch, T time, S key positions, P cached steps, H query heads, K key/value heads, D head dim, N tokens.
"""

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_bidirectional_sliding_window_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.generic import is_flash_attention_requested

from .batching import is_paged, paged_masks
from .grouped_sdpa import grouped_sdpa_attention
from .kernel_warnings import warn_no_attention_weights
from .padding import PackedSequences, same_document
from .tracing import tracing, tracing_for_export

# Kernels that packed sequences replace; eager (weights) and flex keep the padded layout.
UNPADDED_KERNELS = ("sdpa",)


def check_attention_mask(attention_mask: torch.Tensor | None, batch: int, length: int, cached: bool = False) -> None:
    """A [B, T] padding mask must match the inputs; with a cache it covers P + T steps, so it has at least T. A
    ready-made 4D mask (or one per layer type) is passed through, as in stock."""
    if attention_mask is None or isinstance(attention_mask, dict) or attention_mask.dim() == 4:
        return
    if not cached and tuple(attention_mask.shape) != (batch, length):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, expected (batch, seq_len) = {(batch, length)}"
        )
    if cached and (attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < length):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, expected (batch, past + new tokens) with "
            f"batch = {batch} and at least {length} tokens"
        )


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, K, S, D] -> [B, K * groups, S, D], each key/value head serving `groups` query heads."""
    if groups == 1:
        return x
    b, k, s, d = x.shape
    return x[:, :, None].expand(b, k, groups, s, d).reshape(b, k * groups, s, d)


def causal_bool_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """[1, 1, T, S], True where query i may see key j <= i: torch's `is_causal`, which transformers' missing mask
    stands for (no past, or a prefill into an empty static cache, its free slots after the prompt)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()[None, None]


def eager_attention(
    module: nn.Module,
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, K, S, D]
    value: torch.Tensor,  # [B, K, S, D]
    attention_mask: torch.Tensor | None,  # bool [B, 1, T, S] (True = attend) or additive float, or None
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [B, H, T, S]
    if attention_mask is None and module.is_causal and query.shape[2] > 1:
        attention_mask = causal_bool_mask(query.shape[2], key.shape[2], query.device)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    if (sinks := kwargs.get("s_aux")) is not None:  # a sink column in the softmax, dropped after it
        b, h, t, _ = scores.shape
        scores = torch.cat([scores, sinks.to(scores.dtype).view(1, h, 1, 1).expand(b, h, t, 1)], dim=-1)
        scores = scores - scores.amax(dim=-1, keepdim=True)  # as stock: no overflow in half precision
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32)[..., :-1].to(query.dtype)
    else:
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()  # [B, T, H, D]
    return out, weights


def flash_window(window: int | None) -> int | None:
    """A window of `window` positions on each side, as transformers' flash kernels count it."""
    return None if window is None else window + 1


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,  # [1, H, N, D]
    key: torch.Tensor,  # [1, K, N, D]
    value: torch.Tensor,  # [1, K, N, D]
    packed: PackedSequences,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Variable-length attention over packed sequences -> ([1, N, H, D], no weights): flash-attention's varlen
    kernel when a flash implementation is selected, otherwise sdpa per sequence, in blocks of queries under a sliding
    window (`PackedSequences.attention_blocks`; measured fastest on CPU, see benchmarks/encoders.py)."""
    warn_no_attention_weights(module.config, kwargs.get("output_attentions"))
    implementation = module.config._attn_implementation
    if is_flash_attention_requested(requested_attention_implementation=implementation):
        return ALL_ATTENTION_FUNCTIONS[implementation](
            module,
            query,
            key,
            value,
            None,
            scaling=scaling,
            dropout=dropout,
            sliding_window=flash_window(packed.window),
            cu_seq_lens_q=packed.cu_seqlens,
            cu_seq_lens_k=packed.cu_seqlens,
            max_length_q=packed.max_seqlen,
            max_length_k=packed.max_seqlen,
            **kwargs,
        )
    grouped = module.num_key_value_groups > 1  # not from the shapes: tensors under torch.jit.trace
    outs = [
        F.scaled_dot_product_attention(
            query[:, :, queries],
            key[:, :, keys],
            value[:, :, keys],
            attn_mask=mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=grouped,
        )
        for s, e in packed.bounds
        for queries, keys, mask in packed.attention_blocks(s, e)
    ]
    return torch.cat(outs, dim=2).transpose(1, 2), None


def sink_sdpa_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, s_aux=None, **kwargs):
    """sdpa with attention sinks (`s_aux` [H]; the rest as eager_attention's): one more key, all zeros, with a zero
    value and the head's sink as its mask, so the sink takes its share of the softmax and adds nothing."""
    (_, h, t, _), s = query.shape, key.shape[2]
    if attention_mask is None and module.is_causal and t > 1:
        attention_mask = causal_bool_mask(t, s, query.device)
    if attention_mask is None or attention_mask.dtype == torch.bool:
        attention_mask = additive_mask(query.new_zeros(1, 1, t, s), attention_mask, query.dtype)
    bias = attention_mask.to(query.dtype).expand(-1, h, t, s)
    mask = torch.cat([bias, s_aux.to(query.dtype).view(1, h, 1, 1).expand(bias.shape[0], h, t, 1)], dim=-1)
    k, v = F.pad(key, (0, 0, 0, 1)), F.pad(value, (0, 0, 0, 1))  # [B, K, S + 1, D]
    grouped = module.num_key_value_groups > 1  # not from the shapes: tensors under torch.jit.trace
    out = F.scaled_dot_product_attention(query, k, v, mask, dropout, scale=scaling, enable_gqa=grouped)
    return out.transpose(1, 2).contiguous(), None


def attention_kernel(config, mask: object, sinks: bool = False) -> Callable:
    """The kernel for this call: packed sequences' own, else the one the user selected (eager by default); with
    attention sinks, one that honours them or a clear refusal."""
    name = config._attn_implementation
    if not sinks:
        return packed_attention if isinstance(mask, PackedSequences) else _selected(name)
    if isinstance(mask, PackedSequences):
        raise ValueError("attention sinks are not supported on packed sequences; pass unpad_inputs=False")
    if name in (None, "eager", "sdpa"):
        return sink_sdpa_attention if name == "sdpa" and not tracing_for_export() else eager_attention
    if name == "flex_attention" or is_flash_attention_requested(requested_attention_implementation=name):
        return _selected(name)  # transformers' flex and flash kernels read `s_aux`
    if name == "paged|eager":
        return _selected(name)  # transformers' paged eager kernel reads the module's `sinks`
    raise ValueError(f"attn_implementation={name!r} would ignore this model's attention sinks; use 'eager', 'sdpa', "
                     "'flex_attention' or a flash attention kernel that takes sinks (continuous batching: 'eager', "
                     "which runs as 'paged|eager')")  # fmt: skip


def _selected(implementation: str | None) -> Callable:
    found = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention)
    return grouped_sdpa_attention if found is sdpa_attention_forward else found  # the same, its heads not copied


def window_kwargs(config, window: int | None, mask: object) -> dict:
    """Flash kernels take a block's sliding window as an argument rather than from the mask."""
    if window is None or isinstance(mask, PackedSequences) or not is_flash_attention_requested(config=config):
        return {}
    return {"sliding_window": flash_window(window)}


def unpadding_allowed(config, attention_mask: torch.Tensor | None) -> bool:
    """Whether an encoder call may run on packed tokens: a [B, T] mask, a config that allows it, and a kernel that
    benefits (sdpa, flash: neither returns attention weights; eager, which does, stays padded)."""
    if not getattr(config, "unpad_inputs", False) or attention_mask is None or attention_mask.dim() != 2:
        return False
    implementation = config._attn_implementation
    return implementation in UNPADDED_KERNELS or is_flash_attention_requested(
        requested_attention_implementation=implementation
    )


def unpads(config, attention_mask: torch.Tensor | None) -> bool:
    """Whether an encoder call runs on packed tokens: allowed, and the mask has padding. Traced graphs stay
    padded, as the packed sizes depend on the mask's values (tracing.py)."""
    if tracing() or not unpadding_allowed(config, attention_mask):
        return False
    real = int(attention_mask.bool().sum())
    return 0 < real < attention_mask.numel()


def per_block(windows: tuple[int | None, ...], build: Callable[[int | None], object]) -> list:
    """One mask per block, built once per distinct window."""
    masks = {window: build(window) for window in dict.fromkeys(windows)}
    return [masks[window] for window in windows]


def bidirectional_masks(
    config,
    hidden: torch.Tensor,
    attention_mask,
    windows,
    packed: PackedSequences | None,
    documents: torch.Tensor | None = None,
) -> list:
    """An encoder's mask for each block: a PackedSequences (with the block's window) when unpadded, else
    transformers' bidirectional mask (its sliding-window one where the block has a window), within each document
    where a traced row gives `documents` (padding.traced_documents)."""

    def build(window: int | None) -> object:
        if packed is not None:
            return packed.with_window(window)
        overlay = None if documents is None else same_document(documents)
        masks = dict(inputs_embeds=hidden, attention_mask=attention_mask, and_mask_function=overlay)
        if window is None:
            return create_bidirectional_mask(config=config, **masks)
        # transformers' window mask (its window read from the config) needs no vmap, which torch.jit.trace cannot run;
        # traced, it keeps the mask even where it hides nothing (that test would guard a graph on the length)
        windowed = copy.copy(config)
        windowed.sliding_window = window
        return create_bidirectional_sliding_window_mask(
            config=windowed, allow_is_bidirectional_skip=not tracing(), **masks
        )

    return per_block(windows, build)


def causal_masks(
    config, hidden: torch.Tensor, attention_mask, cache, position_ids, windows, first_layer: int = 0
) -> list:
    """A decoder's mask for each block, built by transformers' mask functions, except for the commonest call of
    all: one new token per row, decoded with sdpa or eager attention. That token sees every cached key, so
    padding alone hides any and the mask is the padding mask, [B, 1, 1, P + 1]. A static cache (compiled
    decoding) returns all its slots as keys, used or not: transformers' mask functions size the mask for it.
    Continuous batching brings its own masks (`paged_masks`). The cache is read at the first layer this process
    runs (`first_layer`: a pipeline stage's own, whose earlier layers never write it), per window."""
    if is_paged(cache):
        return paged_masks(attention_mask, windows)
    if isinstance(attention_mask, dict):  # generate's masks over a static cache, one per entry of `layer_types`
        return [attention_mask[layer_type] for layer_type in config.layer_types]
    static = cache is not None and cache.is_compileable
    past = cache.get_seq_length(first_layer) if cache is not None and not static else 0

    def build(window: int | None) -> object:
        if (
            hidden.shape[1] == 1
            and not static
            and window is None
            and config._attn_implementation in ("sdpa", "eager")
            and (attention_mask is None or (attention_mask.dim() == 2 and attention_mask.shape[1] == past + 1))
        ):
            return None if attention_mask is None else attention_mask[:, None, None, :].bool()
        make_mask = create_causal_mask if window is None else create_sliding_window_causal_mask
        layer = next((i for i, w in enumerate(windows) if w == window and i >= first_layer), None)
        if layer is None:  # only layers of an earlier pipeline stage have this window: no block here reads it
            return None
        # The cache goes positionally: its keyword is `cache` in 5.24 and `past_key_values` before.
        return make_mask(config, hidden, attention_mask, cache, position_ids, layer_idx=layer)

    return per_block(windows, build)


def padding_allowed(attention_mask: torch.Tensor | None, key_length: int, name: str) -> torch.Tensor | None:
    """[B, S] 1/0 mask -> bool [B, 1, 1, S] (True = attend), or None without one or without padding (so that the
    kernels add a [1, H, T, S] bias instead of reading a mask per row). Traced graphs always keep the mask."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape[1] != key_length:
        raise ValueError(f"{name} has shape {tuple(attention_mask.shape)}, expected (batch, {key_length})")
    if not tracing() and bool(attention_mask.all()):
        return None
    return attention_mask[:, None, None, :].bool()


def additive_mask(bias: torch.Tensor | None, allowed: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """bias (or 0) where allowed, the dtype's minimum elsewhere: the float mask eager and sdpa add to scores."""
    if allowed is None:
        return bias
    bias = bias if bias is not None else torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, bias, torch.finfo(dtype).min)


def relative_bias_mask(
    bias: torch.Tensor,  # [1, H, T, S]
    attention_mask: torch.Tensor | None,  # [B, S] or [B, P + T], or a ready-made [B, 1, T, S] (bool or additive)
    causal: bool,
    past: int | torch.Tensor = 0,  # cached steps before the queries (a 0-d tensor for a static cache)
    static: bool = False,  # the keys are all the slots of a static cache, used or not
) -> torch.Tensor:  # [B or 1, H, T, S]
    """T5's mask: the relative position bias where a key is visible (padding, and the future in a decoder), the
    dtype's minimum elsewhere, one additive float mask that every block's kernel adds to its scores. A static
    cache's empty slots lie in every query's future, so the causal rule hides them, one query or many."""
    t, s = bias.shape[-2:]
    if attention_mask is not None and attention_mask.dim() == 4:
        if attention_mask.dtype != torch.bool:
            return bias + attention_mask.to(bias.dtype)  # generate's mask for a static cache, as stock adds it
        allowed = attention_mask
    else:
        if static and attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[1] < s:
            attention_mask = F.pad(attention_mask, (0, s - attention_mask.shape[1]), value=1)  # future: causal
        allowed = padding_allowed(attention_mask, s, "attention_mask")  # [B, 1, 1, S]
    if causal and (t > 1 or static):
        query_position = torch.arange(t, device=bias.device)[:, None] + past  # [T, 1]
        causal_allowed = (torch.arange(s, device=bias.device)[None, :] <= query_position)[None, None]  # [1, 1, T, S]
        allowed = causal_allowed if allowed is None else allowed & causal_allowed
    return additive_mask(bias, allowed, bias.dtype)


def cross_mask(attention_mask: torch.Tensor | None, key_length: int, dtype: torch.dtype) -> torch.Tensor | None:
    """[B, 1, 1, S] additive mask over an encoder's positions for cross-attention (None without padding)."""
    return additive_mask(None, padding_allowed(attention_mask, key_length, "attention_mask"), dtype)
