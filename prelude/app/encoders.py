"""How an encoder checkpoint (BERT, XLM-R, ModernBERT) is served, decided once at startup.

Its rows are whole texts on the OneShot path: no prefix cache (a token's state depends on the
tokens after it, so a cached prefix is no prefix of another text's states), no decode path, no
multi-item rows, and no CUDA graphs (bidirectional attention reads each step's row offsets on
the host, which a captured graph would keep from its capture, and a padded row would attend
to its padding). Texts longer than the checkpoint's limit (sentence-transformers'
max_seq_length, else its positions) are truncated by the tokenizer, keeping the closing
separator, as sentence-transformers, TEI and Infinity embed them."""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from prelude.contract.config import Config
from prelude.model.config import ModelConfig

logger = logging.getLogger(__name__)


def encoder_serving(config: Config, model_config: ModelConfig) -> Config:
    """The flags an encoder runs under (the Config unchanged for a decoder)."""
    if model_config.encoder is None:
        return config
    if config.disable_oneshot:
        logger.warning("--disable-oneshot does not apply to %s: an encoder has no decode path",
                       model_config.architecture)
    return replace(config, enable_prefix_caching=False, disable_oneshot=False, multi_item_scoring=False,
                   enforce_eager=True)


def encoder_length(config: Config, model_config: ModelConfig, model_dir: Path,
                   max_model_len: int) -> tuple[int, int | None]:
    """(the longest row served, where the tokenizer cuts texts: None for a decoder). An encoder
    without --max-model-len serves sentence-transformers' max_seq_length where the checkpoint is
    its export, else its positions, and cuts texts there."""
    if model_config.encoder is None:
        return max_model_len, None
    path = model_dir / "sentence_bert_config.json"
    length = json.loads(path.read_text()).get("max_seq_length") if path.is_file() else None
    if config.max_model_len is None and isinstance(length, int) and length > 0:
        max_model_len = min(max_model_len, length)
    return max_model_len, max_model_len
