"""Pure-NumPy oracles for every quantrs kernel.

Independent of the Rust code on purpose: the tests compare the extension
against these. One submodule per domain; the public names are re-exported here.
"""

from .int4 import _fake_quantize_int4, pack_int4, quantize_int4, unpack_int4

__all__ = ["_fake_quantize_int4", "pack_int4", "quantize_int4", "unpack_int4"]
from .optim import AdamWReference, adam_step, decode_moments  # noqa: E402

__all__ += ["AdamWReference", "adam_step", "decode_moments"]
