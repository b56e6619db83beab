"""A safetensors checkpoint as one set of named tensors: a single file, or a Hugging
Face model folder (``model.safetensors``, or ``model.safetensors.index.json`` plus
its shards) with its JSON configuration files.

Everything is validated before any tensor data is touched: each shard's header (by
:class:`~quantrs.cli._stfile.StReader`: offsets tile the data exactly), each shard the
index names exists inside the folder, every tensor the index names is in the shard it
names, and no shard holds a tensor the index does not list.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ._errors import CorruptCheckpointError, TensorNotFoundError
from ._stfile import StFormatError, StReader, TensorInfo

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def read_json(path: Path) -> dict:
    """A JSON object from ``path`` ({} if the file does not exist)."""
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CorruptCheckpointError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _open(path: Path) -> StReader:
    try:
        return StReader(path)
    except StFormatError as e:
        raise CorruptCheckpointError(f"{path}: not a valid safetensors file: {e}") from None


def shard_names(folder: Path) -> tuple[list[str], dict[str, str] | None, dict]:
    """``(shard file names, weight_map or None, index JSON)`` of a model folder."""
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        index = read_json(index_path)
        wmap = index.get("weight_map")
        if not isinstance(wmap, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()
        ):
            raise CorruptCheckpointError(
                f"{index_path}: 'weight_map' must map tensor names to file names"
            )
        shards = list(dict.fromkeys(wmap.values()))
        for s in shards:  # a file name inside the folder, nothing else
            if Path(s).name != s or s in (".", ".."):
                raise CorruptCheckpointError(
                    f"{index_path}: shard name {s!r} is not a file in the folder"
                )
            if not (folder / s).is_file():
                raise CorruptCheckpointError(
                    f"{index_path}: shard {s!r} named by the index is missing"
                )
        return shards, wmap, index
    if (folder / SINGLE_NAME).is_file():
        return [SINGLE_NAME], None, {}
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    if len(found) == 1:
        return found, None, {}
    what = "no .safetensors file" if not found else f"{len(found)} .safetensors files"
    raise CorruptCheckpointError(f"{folder}: {what} and no {INDEX_NAME}")


class Checkpoint:
    """The tensors of a file or model folder, by name. Use as a context manager."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(2, "no such file or folder", str(self.path))
        self.is_folder = self.path.is_dir()
        folder = self.path if self.is_folder else self.path.parent
        if self.is_folder:
            names, wmap, self.index = shard_names(self.path)
            self.shards = [self.path / n for n in names]
        else:
            wmap, self.index, self.shards = None, {}, [self.path]
        self.config = read_json(folder / "config.json")
        # AutoGPTQ / GPTQModel and AutoAWQ also write their settings on their own
        self.quantize_config = read_json(folder / "quantize_config.json") or read_json(
            folder / "quant_config.json"
        )
        self.readers: dict[Path, StReader] = {}
        self._where: dict[str, Path] = {}
        try:
            for shard in self.shards:
                r = self.readers[shard] = _open(shard)
                for t in r.tensors:
                    if t.name in self._where:
                        raise CorruptCheckpointError(
                            f"tensor {t.name!r} is in both {self._where[t.name].name} "
                            f"and {shard.name}"
                        )
                    if wmap is not None and wmap.get(t.name) != shard.name:
                        where = f"puts in {wmap[t.name]!r}" if t.name in wmap else "does not list"
                        raise CorruptCheckpointError(
                            f"{shard.name} holds tensor {t.name!r}, which the index {where}"
                        )
                    self._where[t.name] = shard
            for name, shard_name in (wmap or {}).items():
                if name not in self._where:
                    raise CorruptCheckpointError(
                        f"the index names tensor {name!r} in {shard_name!r}, which does not hold it"
                    )
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for r in self.readers.values():
            r.close()

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def reader(self, name: str) -> StReader:
        return self.readers[self._where[name]]

    def info(self, name: str) -> TensorInfo:
        if name not in self._where:
            raise TensorNotFoundError(f"{self.path}: no tensor {name!r}")
        return self.reader(name).by_name[name]

    def array(self, name: str, dtypes: tuple[str, ...] | None = None) -> np.ndarray:
        """A copy of tensor ``name`` (BF16 and F8 as their raw codes); ``dtypes``: the
        accepted safetensors dtypes."""
        t = self.info(name)
        if dtypes is not None and t.dtype not in dtypes:
            raise CorruptCheckpointError(
                f"tensor {name!r}: expected dtype {' or '.join(dtypes)}, got {t.dtype}"
            )
        return np.array(self.reader(name).array(t))

    def float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` (F32, F16 or BF16) as a new float32 array, exactly."""
        t = self.info(name)
        if t.dtype not in ("F32", "F16", "BF16"):
            raise CorruptCheckpointError(
                f"tensor {name!r}: expected dtype F32, F16 or BF16, got {t.dtype}"
            )
        return np.array(self.reader(name).as_float32(t), np.float32)

    def quant_settings(self) -> dict:
        """The producer's quantization settings: ``config.json``'s
        ``quantization_config``, else ``quantize_config.json`` / ``quant_config.json``."""
        q = self.config.get("quantization_config")
        return q if isinstance(q, dict) else self.quantize_config
