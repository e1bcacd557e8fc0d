"""Load the dataset's splits and turn each row into `input_ids` the way the spec says.

Sources: a Hub dataset id, a local jsonl/json/parquet/arrow file, a local directory of such files (split
names from file names, e.g. `train.jsonl`, `test.jsonl`), or a `save_to_disk` directory. Rows are either
text (`dataset.textField`) or a chat (a list of role/content messages, in the text field or in `messages`),
rendered with the chat template. We tokenize here rather than letting TRL do it, because PEFT's
`add_special_tokens` / `append_concat_token` switches have no TRL equivalent; TRL then packs the
pre-tokenized rows with best-fit-decreasing, which keeps each document's own `position_ids` (see `packing`).

Errors a person must fix (missing file, split or text field, empty split) are `BadDatasetError` (exit 65).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from finetune_api.trainer_input import TrainerInput
from finetune_trainer.errors import BadDatasetError
from finetune_trainer.templates import is_messages, render

log = logging.getLogger(__name__)

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


def _load_raw(path: str, token: str | None) -> Any:
    """A DatasetDict from any of the supported sources."""
    import datasets

    p = Path(path).expanduser()
    if p.is_file():
        fmt = _FORMATS.get(p.suffix)
        if fmt is None:
            raise BadDatasetError(f"dataset.name: {path!r} is not a .jsonl, .json, .parquet or .arrow file")
        return datasets.load_dataset(fmt, data_files={"train": str(p)})
    if p.is_dir():
        if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            loaded = datasets.load_from_disk(str(p))
            return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict(train=loaded)
        return datasets.load_dataset(str(p))
    if path.startswith(("/", "./", "../", "~")):
        raise BadDatasetError(f"dataset.name: local path {path!r} does not exist")
    return datasets.load_dataset(path, token=token)


def load_splits(cfg: TrainerInput, path: str) -> tuple[Any, Any | None]:
    """(train, eval) datasets; eval is None when only one split is configured."""
    from datasets.exceptions import DatasetNotFoundError

    try:
        raw = _load_raw(path, os.environ.get("HF_TOKEN") or None)
    except (FileNotFoundError, DatasetNotFoundError) as e:
        raise BadDatasetError(f"dataset.name: cannot load {path!r}: {str(e).splitlines()[0]}") from e
    splits = cfg.dataset.splits
    missing = [s for s in splits if s not in raw]
    if missing:
        raise BadDatasetError(f"dataset.splits: {missing} not found in {path!r}; it has {sorted(raw.keys())}")
    train = raw[splits[0]]
    evaluation = raw[splits[1]] if len(splits) > 1 else None
    return train, evaluation


def _texts(batch: dict[str, list[Any]], cfg: TrainerInput, tokenizer: Any) -> list[str]:
    """The training text of each row: the text field, or a chat rendered with the template."""
    field = cfg.dataset.text_field
    column = batch.get(field)
    if column is None or (cfg.dataset.chat_template_format != "none" and "messages" in batch):
        column = batch.get("messages", column)
    out: list[str] = []
    for value in column or []:
        if is_messages(value):
            if tokenizer.chat_template is None:
                raise BadDatasetError(
                    f"dataset.textField {field!r} holds chat messages but the tokenizer has no chat template; "
                    "set dataset.chatTemplateFormat to chatml or zephyr"
                )
            out.append(render(tokenizer, value))
        elif isinstance(value, str):
            out.append(value)
        else:
            raise BadDatasetError(
                f"dataset.textField {field!r}: expected text or a list of messages, got {type(value).__name__}"
            )
    return out


def tokenize(ds: Any, cfg: TrainerInput, tokenizer: Any, name: str) -> Any:
    """Rows → `input_ids` with the spec's special-token switches; rejects a missing field or empty split."""
    field = cfg.dataset.text_field
    columns = list(ds.column_names)
    has_chat = cfg.dataset.chat_template_format != "none" and "messages" in columns
    if field not in columns and not has_chat:
        raise BadDatasetError(f"dataset.textField {field!r} is not a column of the {name} split; columns are {columns}")
    if len(ds) == 0:
        raise BadDatasetError(f"dataset.splits: the {name} split is empty")
    eos = [tokenizer.eos_token_id] if cfg.dataset.append_concat_token and tokenizer.eos_token_id is not None else []

    def encode(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        texts = _texts(batch, cfg, tokenizer)
        ids = tokenizer(texts, add_special_tokens=cfg.dataset.add_special_tokens)["input_ids"]
        return {"input_ids": [list(x) + eos for x in ids]}

    from accelerate import PartialState

    with PartialState().local_main_process_first():
        out = ds.map(encode, batched=True, remove_columns=columns, desc=f"Tokenizing {name}")
        out = out.filter(lambda row: len(row["input_ids"]) > 0)
    log.info("%s split: %d rows tokenized from %r", name, len(out), field)
    return out


def load_data(cfg: TrainerInput, path: str, tokenizer: Any) -> tuple[Any, Any | None]:
    """Train and eval datasets ready for SFTTrainer (pre-tokenized)."""
    train, evaluation = load_splits(cfg, path)
    train = tokenize(train, cfg, tokenizer, cfg.dataset.splits[0])
    if evaluation is not None:
        evaluation = tokenize(evaluation, cfg, tokenizer, cfg.dataset.splits[1])
    return train, evaluation
