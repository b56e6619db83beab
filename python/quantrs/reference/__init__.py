"""Pure-NumPy oracles for every quantrs kernel.

Independent of the Rust code on purpose: the tests compare the extension
against these. One submodule per domain; the public names are re-exported here.
"""

from . import fp8, int4, optim, qat
from .fp8 import fp8_grid, fp8_linear_forward, fp8_round
from .int4 import _fake_quantize_int4, pack_int4, quantize_int4, unpack_int4
from .optim import AdamWReference, adam_step, decode_moments

__all__ = [
    "AdamWReference",
    "_fake_quantize_int4",
    "adam_step",
    "decode_moments",
    "fp8",
    "fp8_grid",
    "fp8_linear_forward",
    "fp8_round",
    "int4",
    "optim",
    "pack_int4",
    "qat",
    "quantize_int4",
    "unpack_int4",
]
