//! Where a 32-weight ("legacy") block keeps its codes (`GgmlType::LEGACY`):
//! the facts the AVX2 row dot of those types (`legacy_avx2.rs`) reads the
//! bytes by, one description per type instead of one kernel per type.

/// The code layout of a block of 32 weights with one scale `d` (a half at
/// byte 0) and, for the types with a minimum, `m` (a half at byte 2). The
/// stored code of weight `i` is an unsigned `n_i` (or, for `Bytes`, a
/// signed byte) and the type's code is `q_i = n_i - bias`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Legacy {
    /// Not a 32-weight block with this structure (the k-quants).
    No,
    /// Byte `j` of the 16 at `qs` holds weight `j` in its low nibble and
    /// weight `j + 16` in its high nibble (Q4_0 with bias 8, Q4_1 with 0).
    Nibbles {
        /// Offset of the 16 nibble bytes.
        qs: usize,
        /// The code offset.
        bias: i8,
    },
    /// As `Nibbles`, plus bit `i` of the little-endian u32 at `qh` as the
    /// fifth bit of weight `i` (Q5_0 with bias 16, Q5_1 with 0).
    Fifth {
        /// Offset of the 4 bytes of fifth bits.
        qh: usize,
        /// Offset of the 16 nibble bytes.
        qs: usize,
        /// The code offset.
        bias: i8,
    },
    /// 32 signed bytes at `qs`, in weight order (Q8_0).
    Bytes {
        /// Offset of the 32 code bytes.
        qs: usize,
    },
}

impl Legacy {
    /// The code offset: `q_i = n_i - bias` (0 for `Bytes` and `No`).
    pub const fn bias(self) -> i8 {
        match self {
            Legacy::Nibbles { bias, .. } | Legacy::Fifth { bias, .. } => bias,
            Legacy::No | Legacy::Bytes { .. } => 0,
        }
    }
}
