"""A Hugging Face causal LM trained on token files: `zerotrain.runtime.models.huggingface:build`.

The model comes from its config alone (`config`: a directory holding config.json, or the config's fields inline),
built as `AutoModelForCausalLM.from_config` builds it (or as the named `model_class`), with fresh weights: the
runtime builds it partitioned, and `spec.model.pretrained` loads weights into each rank's shard afterwards. Its
ZeRO units are the decoder layers transformers itself never splits (`_no_split_modules`), so spec.zero.unitModules
need not name them. The loss is next-token cross-entropy in fp32 on the logits, computed here (not by transformers)
so the shift and the ignored targets (-100) are this module's and tested. Data are token files
(`zerotrain.runtime.job.token_data`), split across ranks so the global batch does not depend on the world size.

The plan reads the same config without torch (`zerotrain.hf_config`), so a manifest needs neither
spec.model.parameters nor spec.model.shape for the families counted there.
"""

from __future__ import annotations

import difflib
import importlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
import torch.nn.functional as F

from zerotrain.hf_config import CONFIG_FILE, DEFAULT_BATCH_SIZE, DEFAULT_SEQ_LEN
from zerotrain.runtime.job.data import rank_rows
from zerotrain.runtime.job.evaluation import too_few
from zerotrain.runtime.job.task import ConfigError, LossSum, TrainingTask
from zerotrain.runtime.job.token_data import TokenBatches
from zerotrain.runtime.models.hf_data import (
    DEFAULT_MAX_TRUNCATED,
    Data,
    DataArgs,
    NoTrainingData,
    model_directory,
    open_data,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


def _import_transformers() -> ModuleType | None:
    try:
        transformers = importlib.import_module("transformers")
        # Its init helpers keep the torch.nn.init functions they find when first imported (TORCH_INIT_FUNCTIONS):
        # imported here, with this module, they keep torch's own; imported inside the runtime's partitioned
        # construction they would keep that construction's recording wrappers, which a later construction in the
        # same process would still call.
        importlib.import_module("transformers.modeling_utils")
    except ImportError:
        return None
    return transformers


TRANSFORMERS = _import_transformers()
"""The transformers package, None when it is not installed (build() then says how to install it)."""

IGNORE_INDEX = -100
"""A target never predicted (padding, a prompt not trained on): left out of the loss and of its mean."""
FIELD = "spec.entrypointArgs"


class HasLogits(Protocol):
    """What a transformers causal LM returns: the loss needs only its logits."""

    @property
    def logits(self) -> torch.Tensor: ...


def next_token_loss(output: HasLogits, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (in fp32 whatever the compute dtype) of predicting token i+1 from tokens 0..i, over the
    targets that are not IGNORE_INDEX; 0 when a micro-batch has none (rather than the NaN 0/0 would spread)."""
    logits = output.logits
    targets = batch[:, 1:].reshape(-1)
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets, ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total / (targets != IGNORE_INDEX).sum().clamp_min(1)


def model_inputs(batch: torch.Tensor) -> torch.Tensor:
    """Every token but the last of each row, as input_ids. -100 is no token id the embedding can look up, so an
    ignored position is fed as token 0; causal attention shows it only to itself and the positions after it."""
    return batch[:, :-1].clamp_min(0)


def _transformers() -> ModuleType:
    if TRANSFORMERS is None:
        raise ConfigError(
            "spec.entrypoint: zerotrain.runtime.models.huggingface:build needs transformers, which this image "
            "lacks; install it with `pip install zerotrain[hf]`"
        )
    return TRANSFORMERS


def _known_model_type(transformers: ModuleType, model_type: object, where: str) -> str:
    """`model_type` when transformers has a config class for it; ConfigError listing close names otherwise."""
    known = list(transformers.models.auto.configuration_auto.CONFIG_MAPPING.keys())
    if isinstance(model_type, str) and model_type in known:
        return model_type
    if model_type is None:
        raise ConfigError(
            f"{FIELD}.config: {where} no model_type; add one (e.g. model_type: llama) naming the model's family"
        )
    close = difflib.get_close_matches(str(model_type), known, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else "use one transformers knows (e.g. llama, gpt2, mixtral)"
    raise ConfigError(
        f"{FIELD}.config: {where} model_type {model_type!r}, which transformers "
        f"{transformers.__version__} does not know; {hint}"
    )


def _config_dir(path: str) -> dict[str, Any]:
    """config.json of `path`, parsed; ConfigError when the directory or the file is not there or not JSON."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise ConfigError(
            f"{FIELD}.config: got {path!r}, which is not a directory; give the directory holding config.json (as "
            "save_pretrained writes it) or the config's fields inline"
        )
    file = directory / CONFIG_FILE
    if not file.is_file():
        raise ConfigError(
            f"{FIELD}.config: got {path!r}, which has no {CONFIG_FILE}; give the directory save_pretrained wrote "
            "(config.json beside the weights) or the config's fields inline"
        )
    try:
        fields = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{FIELD}.config: {file} is not readable JSON ({e}); write it again") from None
    if not isinstance(fields, dict):
        raise ConfigError(f"{FIELD}.config: {file} holds {type(fields).__name__}, not an object; write it again")
    return fields


def load_config(transformers: ModuleType, config: str | Mapping[str, Any]) -> PretrainedConfig:
    """The transformers config of `config` (a local directory, never the Hub, or the fields inline)."""
    if isinstance(config, Mapping):
        fields = dict(config)
        model_type = _known_model_type(transformers, fields.pop("model_type", None), "the inline config has")
        loaded: PretrainedConfig = transformers.AutoConfig.for_model(model_type, **fields)
    elif isinstance(config, str):
        _known_model_type(transformers, _config_dir(config).get("model_type"), f"{config}/{CONFIG_FILE} has")
        loaded = transformers.AutoConfig.from_pretrained(str(Path(config).expanduser()), local_files_only=True)
    else:
        raise ConfigError(
            f"{FIELD}.config: got {type(config).__name__}; give a directory holding config.json or the config's "
            "fields inline (a mapping with model_type)"
        )
    # Training never decodes: a key/value cache would only keep every layer's keys and values a while longer.
    loaded.use_cache = False
    return loaded


def _model_class(transformers: ModuleType, config: PretrainedConfig, name: str | None) -> type[PreTrainedModel]:
    """The class to build: `name` from transformers, else the causal-LM class of the config's model_type."""
    if name is None:
        mapping = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        if config.model_type not in mapping:
            raise ConfigError(
                f"{FIELD}.config: model_type {config.model_type!r} has no causal-LM class in transformers; name one "
                "with model_class, or use a decoder model's config"
            )
        name = str(mapping[config.model_type])
    found = getattr(transformers, name, None)
    if not isinstance(found, type) or not issubclass(found, transformers.PreTrainedModel):
        names = [n for n in dir(transformers) if n.endswith(("ForCausalLM", "LMHeadModel"))]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "use a causal-LM class such as LlamaForCausalLM"
        raise ConfigError(f"{FIELD}.model_class: got {name!r}, which transformers has no model class of; {hint}")
    cls = cast("type[PreTrainedModel]", found)
    causal = set(transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if name not in causal:  # a bare model or another head has no logits for the next-token loss
        raise ConfigError(
            f"{FIELD}.model_class: got {name!r}, which is not a causal language model (no next-token logits); use "
            f"its family's *ForCausalLM class, or leave model_class unset"
        )
    wanted = cls.config_class
    if wanted is not None and not isinstance(config, wanted):
        raise ConfigError(
            f"{FIELD}.model_class: got {name!r}, which takes a {wanted.__name__}, but the config is "
            f"model_type {config.model_type!r}; use that family's class or leave model_class unset"
        )
    return cls


def instantiate(cls: type[PreTrainedModel], config: PretrainedConfig, attn_implementation: str) -> PreTrainedModel:
    """`cls` built from `config` as `from_config` builds it, freshly initialised from the current random state."""
    try:
        # fp32 whatever the config's torch_dtype (its weights' storage dtype): the runtime keeps an fp32 master and
        # computes in spec.zero.precision.
        model: PreTrainedModel = cls._from_config(config, dtype=torch.float32, attn_implementation=attn_implementation)
    except (ValueError, ImportError) as e:
        if attn_implementation in ("sdpa", "eager"):
            raise
        first = str(e).strip().splitlines()[0]
        raise ConfigError(
            f"{FIELD}.attn_implementation: got {attn_implementation!r}, which {cls.__name__} cannot use here "
            f"({first}); use sdpa or eager"
        ) from None
    return model


def unit_modules(model: torch.nn.Module) -> list[str]:
    """The decoder-layer classes transformers never splits across devices: the ZeRO units (empty: one root unit)."""
    return sorted(getattr(model, "_no_split_modules", None) or [])


def _check_seq_len(config: PretrainedConfig, seq_len: int) -> None:
    if seq_len < 1:
        raise ConfigError(f"{FIELD}.seq_len: got {seq_len}; it must be at least 1; use e.g. {DEFAULT_SEQ_LEN}")
    limit = getattr(config.get_text_config(), "max_position_embeddings", None)
    if isinstance(limit, int) and seq_len > limit:
        raise ConfigError(
            f"{FIELD}.seq_len: got {seq_len}, beyond the config's max_position_embeddings {limit}; use at most "
            f"{limit}, or a config with longer positions"
        )


def record_loss(output: HasLogits, batch: dict[str, torch.Tensor]) -> LossSum:
    """Cross-entropy (in fp32) summed over the rows' counted labels (already shifted: label i is predicted from input
    i), and their number: the runtime divides by the count over every rank and micro-batch."""
    logits, labels = output.logits, batch["labels"]
    flat = logits.reshape(-1, logits.shape[-1]).float()
    total = F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
    return LossSum(total, (labels != IGNORE_INDEX).sum())


def record_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A record row's input ids and positions (restarting per record when packed) as the model's keyword arguments."""
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}


def check_packing(cls: type[PreTrainedModel], data: DataArgs) -> None:
    """Packed records need a model that keeps them apart: one whose mask follows position ids that restart
    (transformers' `create_causal_mask`), else their tokens would attend across records."""
    if not data.packing:
        return
    module = sys.modules.get(cls.__module__)
    if module is None or not hasattr(module, "create_causal_mask"):
        raise ConfigError(
            f"{FIELD}.packing: true, but {cls.__name__} builds its attention mask without transformers' "
            "create_causal_mask, so packed records would attend to one another; use packing: false (one record a row)"
        )


def _prepared(
    rank: int,
    world_size: int,
    config: str | dict[str, Any],
    data: DataArgs,
    model_class: str | None,
) -> tuple[PretrainedConfig, type[PreTrainedModel], Data]:
    """Everything `build` checks and opens before it builds the model: the config, the class, the data."""
    if data.batch_size < 1:
        raise ConfigError(
            f"{FIELD}.batch_size: got {data.batch_size}; it must be at least 1; use e.g. {DEFAULT_BATCH_SIZE}"
        )
    rank_rows(data.batch_size, rank, world_size)
    transformers = _transformers()
    loaded = load_config(transformers, config)
    _check_seq_len(loaded, data.seq_len)
    cls = _model_class(transformers, loaded, model_class)
    check_packing(cls, data)
    vocab = getattr(loaded.get_text_config(), "vocab_size", None)
    # The data before the model: a wrong path is refused before a large model is built (nothing here draws from
    # the random state the model's initialisation uses).
    opened = open_data(data, rank, world_size, vocab if isinstance(vocab, int) else None, model_directory(config))
    return loaded, cls, opened


DATA_ARGS = ("train", "eval", "seq_len", "batch_size", "token_dtype", "packing", "loss_on", "max_truncated")
"""The entrypointArgs about the data (`hf_data.DataArgs`)."""


def data_args(args: Mapping[str, Any]) -> DataArgs:
    known = {k: args[k] for k in DATA_ARGS if k in args}
    return DataArgs(
        **{"train": None, "eval": None, "seq_len": DEFAULT_SEQ_LEN, "batch_size": DEFAULT_BATCH_SIZE, **known}
    )


def describe(world_size: int, args: Mapping[str, Any], evaluation_batches: int | None = None) -> str:
    """What `zerotrain validate` says of a job of this entry point: its config, class and data checked as `build`
    checks them, and `evaluation_batches` (spec.training.evaluation.batches) against the held-out data, as the
    ranks would (ConfigError), without building the model."""
    if "config" not in args:
        raise ConfigError(f"{FIELD}.config: missing; name a directory with config.json, or give the config's fields")
    data = data_args(args)
    _, cls, opened = _prepared(0, world_size, args["config"], data, args.get("model_class"))
    batches, evaluation = opened.batches, opened.evaluation
    if isinstance(batches, NoTrainingData):
        train = "no train data"
    elif isinstance(batches, TokenBatches):
        train = f"{batches.files.num_tokens:,} training tokens"
    else:
        train = f"records, {'packed' if data.packing else 'padded'} to seq_len, the loss on {data.loss_on}"
    held = f", {len(evaluation)} evaluation micro-batches" if evaluation is not None else ""
    if evaluation_batches is not None and evaluation is None:
        raise ConfigError(
            f"spec.training.evaluation.batches: got {evaluation_batches}, but {FIELD}.eval gives no eval data; name "
            "held-out data (zerotrain data prepare writes val.bin), or drop the evaluation"
        )
    if evaluation_batches is not None and evaluation is not None and len(evaluation) < evaluation_batches:
        raise too_few(evaluation_batches, len(evaluation), evaluation)
    notes = "".join(f"; {note}" for note in opened.notes)
    return f"model: {cls.__name__} from {FIELD}.config; {train}{held} (seq_len {data.seq_len}){notes}"


def build(
    rank: int,
    world_size: int,
    *,
    config: str | dict[str, Any],
    train: str | list[str] | None = None,
    eval: str | list[str] | None = None,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch_size: int = DEFAULT_BATCH_SIZE,
    token_dtype: str = "auto",
    model_class: str | None = None,
    attn_implementation: str = "sdpa",
    packing: bool = False,
    loss_on: str = "answers",
    max_truncated: float = DEFAULT_MAX_TRUNCATED,
) -> TrainingTask:
    """The task for one rank.

    `config`: a local directory holding config.json, or the config's fields inline (with model_type). `train` and
    `eval`: token files (paths or globs; uint16/uint32 as `token_dtype` or their meta.json says), or instruction
    records (`zerotrain data prepare --format chat|prompt-completion`); without `train` the model is built but
    drawing a batch refuses. `batch_size` is the *global* micro-batch in sequences (all ranks together; a multiple of
    the world size) of `seq_len` tokens each. `model_class`: a transformers class name (e.g. "LlamaForCausalLM")
    instead of the config's causal-LM class. `attn_implementation`: as transformers takes it (sdpa, eager,
    flash_attention_2, ...). Records only: `packing` (records packed into rows, kept apart; default one record a
    row), `loss_on` (answers, or all of a record's tokens) and `max_truncated` (the share of records seq_len may cut,
    refused beyond).
    """
    data = DataArgs(train, eval, seq_len, batch_size, token_dtype, packing, loss_on, max_truncated)
    loaded, cls, opened = _prepared(rank, world_size, config, data, model_class)
    model = instantiate(cls, loaded, attn_implementation)
    per_rank = batch_size // world_size
    records = opened.records
    return TrainingTask(
        model=model,
        loss=record_loss if records else next_token_loss,
        batches=opened.batches,
        inputs=record_inputs if records else model_inputs,
        tokens_per_batch=per_rank * seq_len,
        samples_per_batch=per_rank,
        unit_modules=unit_modules(model),
        eval_batches=opened.evaluation,
    )
