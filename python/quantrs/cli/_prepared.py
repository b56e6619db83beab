"""What calibration text gives ``quantrs quantize`` before it streams the tensors: each
chosen tensor's importance (its layer's mean input ``x^2``, for ``--method search``) or
its weight already packed by GPTQ (``--method gptq``). Made by :mod:`._calibration`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Prepared:
    """Per tensor name (``<module>.weight``): ``importance`` float32 ``[in]``, or
    ``packed`` (a ``QuantizedWeight`` / ``Int4AsymWeight``)."""

    importance: dict[str, np.ndarray] = field(default_factory=dict)
    packed: dict[str, object] = field(default_factory=dict)

    def of(self, name: str) -> tuple[np.ndarray | None, object | None]:
        return self.importance.get(name), self.packed.get(name)
