"""Startup problems an operator can fix, each reported as one line naming the problem and the
fix (exit code 2, no traceback unless --log-level debug): the listening address, the model
directory and its files. Checked before anything slow runs, so a typo costs a second."""
from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path

from prelude.contract.config import ALLOW_LONG_MAX_MODEL_LEN_ENV, Config


class StartupError(Exception):
    """The server cannot start; str() is the one line shown to the operator."""


def listen_error(config: Config, exc: OSError) -> StartupError:
    """What a failed bind means, and what to do about it."""
    if config.uds is not None and exc.errno == errno.EADDRINUSE:
        return StartupError(f"Unix socket {config.uds} is in use by a running server; stop that server or "
                            "choose another path with --uds")
    if config.uds is not None and exc.errno == errno.EEXIST:
        return StartupError(f"{config.uds} exists and is not a socket (a file not ours to remove); "
                            "choose another path with --uds")
    if config.uds is not None:
        return StartupError(f"cannot listen on Unix socket {config.uds}: {exc.strerror or exc}; "
                            "choose a writable path with --uds")
    where = f"{config.host}:{config.port}"
    if isinstance(exc, socket.gaierror):
        return StartupError(f"cannot resolve --host {config.host!r} ({exc.strerror}); give an IP address "
                            "such as 127.0.0.1 or 0.0.0.0")
    if exc.errno == errno.EADDRINUSE:
        return StartupError(f"port {config.port} on {config.host} is already in use; stop the process "
                            "listening there or choose another port with --port")
    if exc.errno == errno.EACCES:
        return StartupError(f"permission denied to listen on {where} (ports below 1024 need privileges); "
                            "choose a port above 1023 with --port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return StartupError(f"cannot listen on {where}: no interface of this machine has address "
                            f"{config.host}; use --host 127.0.0.1 or 0.0.0.0")
    return StartupError(f"cannot listen on {where}: {exc.strerror or exc}; check --host and --port")


def check_model_dir(path: Path) -> None:
    """The directory exists, is readable, and holds the two files every model needs before
    anything is parsed: config.json (valid JSON) and tokenizer.json."""
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise StartupError(f"--model {str(path)!r} is not a local directory (it {what}); give the path of a "
                           "Hugging Face-format model directory (nothing is downloaded)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise StartupError(f"cannot read model directory {path} (permission denied); make it readable "
                           f"by this user, e.g. chmod -R a+rX {path}")
    config = path / "config.json"
    if not config.exists():
        raise StartupError(f"{path} has no config.json; point --model at a Hugging Face-format model directory")
    for name in ("config.json", *OPTIONAL_JSON):
        if (path / name).exists():
            _check_json(path / name)
    tokenizer = path / "tokenizer.json"
    if not tokenizer.exists():
        raise StartupError(f"{path} has no tokenizer.json (Prelude reads only that format); write it with "
                           f"`AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)` (transformers)")
    if not os.access(tokenizer, os.R_OK) or tokenizer.is_dir():
        raise StartupError(f"cannot read {tokenizer}; make it a readable file, e.g. chmod a+r {tokenizer}")


# The model directory's other JSON files the server reads where they exist: a damaged one
# failed startup with a traceback from deep in the loader.
OPTIONAL_JSON = ("generation_config.json", "tokenizer_config.json", "modules.json", "sentence_bert_config.json",
                 "config_sentence_transformers.json", "model.safetensors.index.json")


def _check_json(file: Path) -> None:
    try:
        json.loads(file.read_bytes())
    except OSError as exc:
        raise StartupError(f"cannot read {file} ({exc.strerror or exc}); make it a readable file, "
                           f"e.g. chmod a+r {file}") from exc
    except ValueError as exc:
        raise StartupError(f"{file} is not valid JSON ({exc}); restore the checkpoint's {file.name}") from exc


def checked_max_model_len(config: Config, max_positions: int, model_dir: Path, learned_positions: bool = False) -> int:
    """--max-model-len, or the model's max_position_embeddings. Past those positions the model
    never trained (its outputs degrade without a word), so asking for more is refused, as vLLM
    refuses it, unless the operator opts in. `learned_positions`: a table of position embeddings
    (BERT's, XLM-R's), which has no row past it: refused whatever the operator says (a longer
    input answered 500, an index out of range)."""
    wanted = config.max_model_len
    if wanted is None:
        return max_positions
    if wanted > max_positions and learned_positions:
        raise StartupError(f"--max-model-len {wanted} is greater than the model's max_position_embeddings "
                           f"({max_positions} in {model_dir / 'config.json'}), and its learned position table "
                           "has no row past it")
    if wanted > max_positions and not config.allow_long_max_model_len:
        raise StartupError(f"--max-model-len {wanted} is greater than the model's max_position_embeddings "
                           f"({max_positions} in {model_dir / 'config.json'}); positions past it may give "
                           f"wrong outputs. Use --max-model-len {max_positions} or less, or set "
                           f"{ALLOW_LONG_MAX_MODEL_LEN_ENV}=1 to allow it")
    return wanted
