"""What every fivefold model shares with transformers: the capability flags, weight init by role, saving under
our own names with shipped code, loading stock checkpoints directly, and loading folders written by an earlier
layout of fivefold's own names."""

import os
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.distributed.parallel_utils import replace_layer_number_by_wildcard

from .attention import Attention
from .block import Block
from .expert_offload import attach_expert_offload, check_stock_offload
from .expert_parallel import distribute, expert_layers, gather_experts
from .offloaded_loading import read_without_offloaded, skips_offloaded_reads
from .owned_memory import own_file_backed_tensors, return_freed_memory
from .parallel import HeadColumns  # noqa: F401  (registers fivefold's tensor-parallel style)
from .pinned_folder import ReportsTheFolderGiven, named_as_given, pinned_folder, replaced
from .pipeline import adapt_stage, check_pipeline_parallel
from .prequantized_offload import leaving, left_by_this_load, load_leaving, plan
from .quantization import (
    check_quantized,
    check_quantizing_to_disk,
    drop_quantization_only,
    is_quantized_weight,
    prepare_for_quantizer,
    quantize_embeddings,
    saved_once,
)
from .quantized_experts import offloaded_parts_saved
from .quantized_loading import read_through_pread, reads_one_tensor_at_a_time
from .rank_zero import on_rank_0
from .rotary import RotaryEmbedding


class FivefoldPreTrainedModel(ReportsTheFolderGiven, PreTrainedModel):
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["TokenEmbeddings", "PatchEmbeddings", "Block"]
    _can_record_outputs = {"hidden_states": Block, "attentions": Attention}
    # {regex: replacement} from the tensor names of an earlier fivefold layout to today's (re.sub on each key):
    # folders converted before a rename still load.
    _renamed_keys: ClassVar[dict[str, str]] = {}
    # fivefold's converter (`fivefold.conversion`), set when fivefold is imported: it converts stock checkpoints
    # in memory and writes the shipped code. None in code shipped inside a checkpoint and run without fivefold,
    # where only checkpoints in fivefold's layout exist and transformers copies the code itself.
    converter: ClassVar[Any] = None
    # Copy CPU weights out of the memory-mapped checkpoint at load (owned_memory.py says why and what it costs);
    # False keeps them mapped, for a checkpoint on storage nobody changes.
    copy_file_backed_weights: ClassVar[bool] = True
    # Set under expert parallelism: the ranks whose batches the load-balancing loss counts together, and the ranks
    # that split the experts.
    data_parallel_group: Any = None
    expert_group: Any = None
    # The `experts_implementation` values fivefold honours. Its experts are each their own linear layers (what
    # quantizers, offloading and expert parallelism reach), run one after another: stock's stacked kernels
    # (batched_mm, grouped_mm, ...) read fused 3-D weights that fivefold does not hold, so they are refused.
    experts_implementations: ClassVar[tuple[str, ...]] = ("eager",)
    # Where a device_map offloads experts: the cache that holds those recently used (modeling/expert_offload.py).
    expert_cache: Any = None
    # Set on rank 0 while it writes a sharded model's weights, which every rank gathered before (_save_sharded).
    _weights_gathered: bool = False

    # Weights are initialised by role in transformers' `_init_weights`, which every fivefold part satisfies:
    # linear and embedding ~ N(0, initializer_range) with zero bias and zero padding row, norms to identity;
    # a module marked with a `WeightInit` (ModernBERT's heads, T5's projections, as stock scales them) from that.
    # It is guarded, so it never overwrites a loaded tensor. Non-persistent buffers are rebuilt below: meta
    # loading leaves them as uninitialised memory.

    def _init_weights(self, module: nn.Module) -> None:
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if own and all(t.device.type == "meta" for t in own):
            # Offloaded by a device_map (read from the checkpoint at each call) or built on meta: no data to
            # initialise, and initialising meta tensors through torch's Python references cost ~2 ms a tensor,
            # 0.15 s of a 0.5 s load of the reduced Mixtral with 28 experts offloaded.
            return
        super()._init_weights(module)
        if (weight_init := getattr(module, "weight_init", None)) is not None:  # a role-scaled std
            if weight_init.cutoff is None:
                init.normal_(module.weight, mean=0.0, std=weight_init.std)
            else:
                bound = weight_init.cutoff * weight_init.std
                init.trunc_normal_(module.weight, mean=0.0, std=weight_init.std, a=-bound, b=bound)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        if isinstance(module, RotaryEmbedding):
            inv_freq, _ = module.initial_frequencies()
            init.copy_(module.inv_freq, inv_freq)
            if module.dynamic:
                init.copy_(module.base_inv_freq, inv_freq)

    def post_init(self) -> None:
        super().post_init()
        # transformers sets `config.quantization_config` before building the model it then hands to the quantizer.
        prepare_for_quantizer(self, getattr(self.config, "quantization_config", None))

    def _get_dtype_plan(self, dtype: torch.dtype) -> dict:
        return drop_quantization_only(super()._get_dtype_plan(dtype))

    def get_correct_experts_implementation(self, requested_experts: str | None) -> str:
        """transformers' check of `experts_implementation` (from_pretrained, set_experts_implementation): unset
        means eager, and a value fivefold does not honour is an error rather than silently ignored."""
        if requested_experts is None:
            return self.experts_implementations[0]
        if requested_experts not in self.experts_implementations:
            valid = ", ".join(repr(v) for v in self.experts_implementations)
            raise ValueError(
                f"{type(self).__name__} does not support experts_implementation={requested_experts!r}: fivefold runs "
                f"each expert as its own linear layers, one after another. Supported: {valid}."
            )
        return requested_experts

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike | None, *model_args, **kwargs):
        """Loads fivefold checkpoints, and also stock ones (e.g. a `bert` folder), converting them in memory.
        Experts a `device_map` offloads go through an expert cache (`model.expert_cache`); a quantizer that quantized
        nothing raises QuantizationError. CPU weights get memory of their own (`copy_file_backed_weights`), so a shard
        changed under the model cannot crash it; with offloaded experts, only misaligned ones (docs/offload.md)."""
        name = pretrained_model_name_or_path
        if kwargs.get("device_map") is not None:  # offloaded experts are read from the folder's files later on
            loaded = cls._load(name, *model_args, **kwargs)
        else:
            loaded = cls._load_whole_folder(name, *model_args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, info) with output_loading_info
        quantize_embeddings(model)
        check_quantized(model)
        model.expert_cache = attach_expert_offload(model, kwargs.get("max_memory"))
        if cls.copy_file_backed_weights:  # offloaded experts stay in their files, and aligned ones may too
            own_file_backed_tensors(model, only_misaligned=model.expert_cache is not None)
        if getattr(model, "is_quantized", False):
            return_freed_memory()  # the full-precision weights the quantizer replaced
        return loaded

    @classmethod
    def _load_whole_folder(cls, name: str | os.PathLike | None, *model_args, **kwargs):
        """A local folder read through one handle (pinned_folder.py): the old folder or, if it was replaced and
        removed during the load, the new one, never a mix of the two."""
        with pinned_folder(name) as folder:
            try:
                loaded = cls._load(folder, *model_args, **kwargs)
            except Exception as error:
                if not replaced(name, folder):
                    raise named_as_given(error, folder, name)  # noqa: B904 (the same exception, re-raised)
            else:
                model = loaded[0] if isinstance(loaded, tuple) else loaded
                if folder != name:  # the name a user gave, not the handle's
                    model.config._name_or_path = model.name_or_path = os.fspath(name)
                return loaded
        return cls._load(name, *model_args, **kwargs)

    @classmethod
    def _load(cls, name: str | os.PathLike | None, *model_args, **kwargs):
        if cls.converter is not None and name is not None:
            options = ("revision", "subfolder", "token", "variant", "use_safetensors", "key_mapping")
            files = {k: kwargs.get(k) for k in options}  # where the stock files are, which, and their names
            stock = cls.converter.open_stock_checkpoint(cls, name, kwargs.get("config"), **files)
            if stock is not None:
                check_stock_offload(name, kwargs)
                for key in ("config", *files):  # the converted state and a local config replace them
                    kwargs.pop(key, None)
                with stock as (config, state_dict, generation):  # the folder's generation config, as stock reads it
                    kwargs.setdefault("generation_config", generation)
                    return super().from_pretrained(None, *model_args, config=config, state_dict=state_dict, **kwargs)
        if cls._renamed_keys:
            kwargs["key_mapping"] = {**cls._renamed_keys, **(kwargs.get("key_mapping") or {})}
        planned = plan(cls, name, kwargs)  # experts on "disk": where they stay, for "auto" where they go
        with leaving(planned.left):
            return planned.done(super().from_pretrained(name, *model_args, **planned.kwargs))

    @staticmethod
    def _load_pretrained_model(model, state_dict, checkpoint_files, load_config, expected_keys=None):
        """transformers' loading of the weights; a quantizer quantizing at load reads the shards through `pread`,
        one tensor at a time (quantized_loading.py); tensors offloaded to "disk" as they are stored are not read
        (offloaded_loading.py). A quantizer is not given weights that go to "disk" (check_quantizing_to_disk)."""
        check_quantizing_to_disk(model, load_config)
        load = PreTrainedModel._load_pretrained_model
        if (left := left_by_this_load()) and state_dict is None and checkpoint_files:  # read when they run
            return load_leaving(left, load, model, checkpoint_files, load_config, expected_keys)
        if reads_one_tensor_at_a_time(state_dict, checkpoint_files, load_config):
            with read_through_pread(checkpoint_files) as read:
                return load(model, read, checkpoint_files, load_config, expected_keys)
        if skips_offloaded_reads(state_dict, checkpoint_files, load_config):
            with read_without_offloaded(model, checkpoint_files, load_config) as read:
                return load(model, read, checkpoint_files, load_config, expected_keys)
        return load(model, state_dict, checkpoint_files, load_config, expected_keys)

    def get_parameter_or_buffer(self, target: str) -> Any:
        """transformers' lookup, which a save asks of every tensor on meta in the state dict: while a quantized model
        with experts left in its checkpoint is saved, those include their stored parts (quantized_experts.py)."""
        part = self.__dict__.get("offloaded_parts", {}).get(target)
        return part if part is not None else super().get_parameter_or_buffer(target)

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> nn.Embedding:
        """transformers' resize, refused for a quantized input table (`include_input_output_embeddings=True`):
        its new rows are made from the full-precision values, which a quantized table no longer has."""
        if is_quantized_weight(getattr(self.get_input_embeddings(), "weight", None)):
            raise NotImplementedError(
                f"{type(self).__name__}'s input embedding table is quantized (include_input_output_embeddings=True), "
                "so it cannot be resized. Resize before quantizing: load the model without quantization_config, "
                "call resize_token_embeddings, save_pretrained, and load that folder quantized; or quantize without "
                "include_input_output_embeddings."
            )
        return super().resize_token_embeddings(*args, **kwargs)

    def init_parallel_plans(self) -> None:
        super().init_parallel_plans()
        # One plan serves every variant of an architecture (T5 with and without gates; a head model holds its base
        # under a prefix): keep the rules that name a module of this model.
        names = {replace_layer_number_by_wildcard(name) for name, _ in self.named_modules()}
        self._tp_plan = {rule: style for rule, style in self._tp_plan.items() if rule in names}
        self._fsdp_plan = {rule: style for rule, style in self._fsdp_plan.items() if rule in names}

    @classmethod
    def maybe_distribute_model(cls, model, distributed_config, mesh_manager):
        """transformers' hook between building on meta and loading: expert parallelism is fivefold's own (all-to-all
        over per-expert modules, expert_parallel.py); the rest is stock's."""
        if mesh_manager is not None and distributed_config.ep_size > 1 and expert_layers(model):
            return distribute(model, distributed_config, mesh_manager)
        if mesh_manager is not None and distributed_config.pp_size > 1:
            check_pipeline_parallel(model)
            model = super().maybe_distribute_model(model, distributed_config, mesh_manager)
            adapt_stage(model)
            return model
        if mesh_manager is not None and distributed_config.dp_size > 1:
            # Tied before FSDP2 shards them (transformers ties only after loading): FSDP2 then knows both modules
            # of a tied weight, else the output embedding keeps a stale copy after the first step.
            model.tie_weights()
        return super().maybe_distribute_model(model, distributed_config, mesh_manager)

    def gather_sharded_state_dict_for_save(self, model_to_save, state_dict, distributed_config, **kwargs):
        if self._weights_gathered:  # by every rank before rank 0 began to write (_save_sharded)
            return state_dict
        state_dict = super().gather_sharded_state_dict_for_save(model_to_save, state_dict, distributed_config, **kwargs)
        if distributed_config is not None and distributed_config.ep_size > 1:
            return gather_experts(model_to_save, state_dict)
        return state_dict

    def barrier_after_gathered_checkpoint_save(self, distributed_config) -> None:
        """transformers' barrier after rank 0 wrote a sharded model: fivefold's sharded save ends with rank 0 telling
        every rank how its write went instead (_save_sharded), which a failed write cannot leave them waiting in."""
        if not self._weights_gathered:
            super().barrier_after_gathered_checkpoint_save(distributed_config)

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """Saves under fivefold's tensor names with a flat copy of the modeling code and an `auto_map`, so that
        stock transformers loads the folder with `trust_remote_code=True`. The folder is written beside and
        swapped in whole (the converter's `updated_folder`): a save killed midway leaves the old folder."""
        # transformers' default re-saves under the stock names of any registered conversion: never what we want.
        kwargs.setdefault("save_original_format", False)
        if getattr(self, "_pp_stage", None) is not None:  # the same on every rank: refused before anything is written
            raise NotImplementedError(
                f"{type(self).__name__} is split into pipeline stages (pp_size > 1): each rank holds only its own "
                "stage's layers, so a save would write a partial checkpoint; save the model loaded without pp_size"
            )
        if self.converter is not None and not kwargs.get("distributed_checkpoint") and sharded_over_ranks(self.config):
            return self._save_sharded(save_directory, *args, **kwargs)
        # Under torch.distributed rank 0 writes: another rank writing code into a folder swapped in whole would
        # replace rank 0's.
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank():
            kwargs["is_main_process"] = False
        in_place = kwargs.get("distributed_checkpoint") or os.path.isfile(save_directory)  # every rank writes there
        if self.converter is None or not kwargs.get("is_main_process", True) or in_place:
            return self._save_into(save_directory, *args, **kwargs)
        self._save_whole(save_directory, *args, **kwargs)

    def _save_whole(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """The folder written beside `save_directory` and swapped in whole, once the file system says it has room."""
        if kwargs.get("push_to_hub"):
            kwargs.setdefault("repo_id", os.path.basename(os.path.abspath(save_directory)))  # not the temporary name
        state_dict = kwargs.get("state_dict")
        weights = _weight_bytes(self.state_dict() if state_dict is None else state_dict)
        needed = weights + self.converter.remote_code_bytes(type(self.config))
        with self.converter.updated_folder(save_directory, needed=needed) as folder:
            self._save_into(folder, *args, **kwargs)

    def _save_sharded(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """A model sharded over ranks (tensor, fully sharded or expert parallelism), which every rank saves: each
        rank sends its shards to rank 0 first (transformers' gather, then the experts), then rank 0 alone writes the
        folder as any save writes it and tells every rank how that went. A write that fails (a full disk) ends every
        rank with its error (the others with `ConversionError: rank 0 could not save ...`), where transformers' barrier
        after the write kept them waiting for a rank that had left it (until the process group's timeout, or for
        good while rank 0 lived on). Every decision that sends a rank another way is rank 0's, told to all."""
        if getattr(self, "hf_quantizer", None) is not None:  # the same on every rank: refused before any collective
            raise NotImplementedError(
                f"{type(self).__name__} is quantized and sharded over ranks: saving it is not supported (the "
                "quantizer's own state dict holds one rank's shards); save the model before quantizing it"
            )
        rank = torch.distributed.get_rank()
        writes = rank == 0 and kwargs.pop("is_main_process", True)
        state_dict = kwargs.pop("state_dict", None)
        state_dict = self.gather_sharded_state_dict_for_save(
            self, self.state_dict() if state_dict is None else state_dict, self.config.distributed_config,
            save_on_this_rank=writes,
        )  # fmt: skip

        def write() -> None:
            if not writes:
                return
            self._weights_gathered = True
            try:
                if os.path.isfile(save_directory):
                    raise ValueError(f"{save_directory} is a file: save_pretrained writes a folder")
                self._save_whole(save_directory, *args, state_dict=state_dict, **kwargs)
            finally:
                self._weights_gathered = False

        def said(error: BaseException) -> str:  # a ConversionError says what it is; anything else names its type
            return str(error) if isinstance(error, self.converter.ConversionError) else repr(error)

        on_rank_0(
            write, lambda told: self.converter.ConversionError(f"rank 0 could not save {save_directory}: {told}"), said
        )

    def _save_into(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        # A class loaded as remote code has `_auto_class` set, and transformers copies its (flat) files itself.
        if self.converter is not None and self._auto_class is None and kwargs.get("is_main_process", True):
            os.makedirs(save_directory, exist_ok=True)
            # Written before the weights so that push_to_hub uploads the code too.
            self.config.auto_map = self.converter.write_remote_code(save_directory, type(self.config))
        with saved_once(self), offloaded_parts_saved(self):
            super().save_pretrained(save_directory, *args, **kwargs)


def sharded_over_ranks(config) -> bool:
    """Whether the model is split over the ranks of a process group (tensor, fully sharded or expert parallelism),
    so that every rank takes part in saving it: what transformers' barrier after a save waits for."""
    layout = getattr(config, "distributed_config", None)
    return (
        layout is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and (layout.tp_size > 1 or layout.dp_size > 1 or layout.ep_size > 1)
    )


def _weight_bytes(state_dict: dict[str, torch.Tensor]) -> int:
    """The weights' bytes as saved (a tied tensor once): what the folder needs at least."""
    seen = {}
    for t in state_dict.values():
        local = getattr(t, "_local_tensor", t)  # a DTensor counts its global size, keyed by its own shard
        if local.device.type != "meta":
            seen[local.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())
