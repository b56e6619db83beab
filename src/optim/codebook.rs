//! The code books of the 4-bit (and 8-bit) optimizer state.
//!
//! Every table is sorted ascending, so the nearest code of a normalized value
//! `x` is the number of midpoints `(t[k] + t[k+1]) / 2` strictly below `x`
//! (ties go to the lower code). Values outside the table's range saturate at
//! its ends.
//!
//! - m (signed, normalized by the block's absmax):
//!   - `NF4`: the 16 NormalFloat4 values of QLoRA (Dettmers et al. 2023,
//!     "QLoRA", appendix E); it contains an exact 0, so an all-zero block
//!     and zero entries decode to exactly 0.
//!   - `INT4`: symmetric linear `{k/7 : k = -7..7}`; code 0 duplicates -1 and
//!     is never produced by the encoder.
//!   - `DYNAMIC4`: the signed 4-bit dynamic-exponent map (Dettmers et al.
//!     2022, "8-bit Optimizers via Block-wise Quantization", with 3 exponent
//!     bits); the values are those torchao's `create_dynamic_map` gives.
//!   - [`dynamic8`]: the signed 8-bit dynamic-tree map of the same paper
//!     (7 exponent levels, 127 positive values, their negatives, 0 and 1).
//! - v (unsigned, never decodes a positive value to 0, see [`VarianceMap`]).

/// NF4 (QLoRA), ascending.
pub const NF4: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// Symmetric linear 4-bit map `k/7`, `k = -7..=7`; code 0 repeats -1.
pub const INT4: [f32; 16] = [
    -1.0,
    -1.0,
    -6.0 / 7.0,
    -5.0 / 7.0,
    -4.0 / 7.0,
    -3.0 / 7.0,
    -2.0 / 7.0,
    -1.0 / 7.0,
    0.0,
    1.0 / 7.0,
    2.0 / 7.0,
    3.0 / 7.0,
    4.0 / 7.0,
    5.0 / 7.0,
    6.0 / 7.0,
    1.0,
];

/// Signed 4-bit dynamic-exponent map, ascending.
pub const DYNAMIC4: [f32; 16] = [
    -0.8875, -0.6625, -0.4375, -0.2125, -0.0775, -0.0325, -0.0055, 0.0, 0.0055, 0.0325, 0.0775,
    0.2125, 0.4375, 0.6625, 0.8875, 1.0,
];

/// The signed 8-bit dynamic-tree map: for exponent level `i = 0..7`, the
/// `2^i` midpoints of `linspace(0.1, 1, 2^i + 1)` scaled by `10^(i - 6)`,
/// mirrored, plus 0 and 1; 256 values, ascending.
pub fn dynamic8() -> [f32; 256] {
    let mut vals: Vec<f64> = vec![0.0, 1.0];
    for i in 0..7i32 {
        let n = 1usize << i;
        let scale = 10f64.powi(i - 6);
        for k in 0..n {
            let a = 0.1 + 0.9 * k as f64 / n as f64;
            let b = 0.1 + 0.9 * (k + 1) as f64 / n as f64;
            let mid = (a + b) / 2.0 * scale;
            vals.push(mid);
            vals.push(-mid);
        }
    }
    vals.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let mut out = [0f32; 256];
    for (o, v) in out.iter_mut().zip(&vals) {
        *o = *v as f32;
    }
    out
}

/// The unsigned 4-bit maps for the second moment. Each is a table of 16
/// positive values (so no positive v decodes to 0) applied either to v
/// itself or to `sqrt(v)` (the "domain"); the block scale is the block's
/// maximum in that domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VarianceMap {
    /// lpmm's "linear without zero" `{k/16 : k = 1..16}` on v (torchao's
    /// choice). Small v round up to absmax/16, which shrinks their steps.
    Linear,
    /// The same table on `sqrt(v)`: 16x finer for small v.
    SqrtLinear,
    /// Log-spaced (dynamic exponent, unsigned) `geomspace(1e-4, 1, 16)` on v.
    Log,
    /// Log-spaced `geomspace(1e-2, 1, 16)` on `sqrt(v)` (the same range in v).
    SqrtLog,
}

impl VarianceMap {
    /// Every map, in declaration order.
    pub const ALL: [VarianceMap; 4] = [
        VarianceMap::Linear,
        VarianceMap::SqrtLinear,
        VarianceMap::Log,
        VarianceMap::SqrtLog,
    ];

    /// Parse a map name (`linear`, `sqrt_linear`, `log`, `sqrt_log`; case-insensitive).
    pub fn parse(s: &str) -> Option<VarianceMap> {
        match s.trim().to_ascii_lowercase().as_str() {
            "linear" => Some(VarianceMap::Linear),
            "sqrt_linear" => Some(VarianceMap::SqrtLinear),
            "log" => Some(VarianceMap::Log),
            "sqrt_log" => Some(VarianceMap::SqrtLog),
            _ => None,
        }
    }

    /// The name `parse` accepts and checkpoints store.
    pub fn name(self) -> &'static str {
        match self {
            VarianceMap::Linear => "linear",
            VarianceMap::SqrtLinear => "sqrt_linear",
            VarianceMap::Log => "log",
            VarianceMap::SqrtLog => "sqrt_log",
        }
    }

    /// True when the map quantizes `sqrt(v)` rather than v.
    pub fn sqrt_domain(self) -> bool {
        matches!(self, VarianceMap::SqrtLinear | VarianceMap::SqrtLog)
    }

    /// The 16 code values, ascending, all positive.
    pub fn table(self) -> [f32; 16] {
        let mut t = [0f32; 16];
        match self {
            VarianceMap::Linear | VarianceMap::SqrtLinear => {
                for (k, x) in t.iter_mut().enumerate() {
                    *x = (k + 1) as f32 / 16.0;
                }
            }
            VarianceMap::Log | VarianceMap::SqrtLog => {
                let decades = if self == VarianceMap::Log { 4.0 } else { 2.0 };
                for (k, x) in t.iter_mut().enumerate() {
                    *x = 10f64.powf(-decades * (15 - k) as f64 / 15.0) as f32;
                }
            }
        }
        t
    }
}

/// A table of `N` values (`N` a power of two: 16 for the 4-bit codes, 256
/// for the int8 m) with its `N - 1` midpoints, padded with +inf to `N` so
/// that one SIMD register (or gather table) holds each.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Codebook<const N: usize> {
    pub values: [f32; N],
    pub mids: [f32; N],
}

/// The 4-bit code book (m and v).
pub type Codebook16 = Codebook<16>;
/// The 256-entry table of the int8 m codec.
pub type Codebook256 = Codebook<256>;

impl<const N: usize> Codebook<N> {
    /// Code bits: `log2(N)`.
    const BITS: u32 = N.trailing_zeros();

    pub fn new(values: [f32; N]) -> Self {
        let mut mids = [f32::INFINITY; N];
        for k in 0..N - 1 {
            mids[k] = (values[k] + values[k + 1]) * 0.5;
        }
        Codebook { values, mids }
    }

    /// Nearest code of `x`: a branch-free binary search over the midpoints
    /// (data-dependent branches mispredict half the time), one compare per
    /// code bit from the top; the SIMD kernels run the same steps
    /// lane-wise.
    #[inline(always)]
    pub fn encode(&self, x: f32) -> u8 {
        let mut idx = 0usize;
        for shift in (0..Self::BITS).rev() {
            idx += ((x > self.mids[idx + (1 << shift) - 1]) as usize) << shift;
        }
        idx as u8
    }

    /// The value of `code` (its low `log2(N)` bits).
    #[inline(always)]
    pub fn decode(&self, code: u8) -> f32 {
        self.values[code as usize & (N - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nearest(values: &[f32], x: f32) -> usize {
        // Linear scan; ties to the lower index.
        let mut best = 0;
        for (k, v) in values.iter().enumerate() {
            if (x - v).abs() < (x - values[best]).abs() {
                best = k;
            }
        }
        best
    }

    #[test]
    fn tables_sorted_and_v_maps_positive() {
        for t in [NF4, INT4, DYNAMIC4] {
            assert!(t.windows(2).all(|w| w[0] <= w[1]));
            assert!(t.contains(&0.0));
        }
        // The SIMD searches count the midpoints below a value, which is the
        // binary search's code only for sorted midpoints.
        for t in [NF4, INT4, DYNAMIC4]
            .into_iter()
            .chain(VarianceMap::ALL.map(|m| m.table()))
        {
            let mids = Codebook16::new(t).mids;
            assert!(mids.windows(2).all(|w| w[0] <= w[1]), "{t:?}");
        }
        for map in VarianceMap::ALL {
            let t = map.table();
            assert!(t.windows(2).all(|w| w[0] < w[1]), "{map:?}");
            assert!(t[0] > 0.0 && t[15] == 1.0, "{map:?}");
        }
        let d8 = dynamic8();
        assert!(d8.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(d8[255], 1.0);
        assert!(d8.contains(&0.0));
    }

    #[test]
    fn encode_is_nearest() {
        for t in [NF4, INT4, DYNAMIC4, VarianceMap::Log.table()] {
            let cb = Codebook16::new(t);
            for i in -1200..=1200 {
                let x = i as f32 / 1000.0;
                let c = cb.encode(x) as usize;
                let n = nearest(&t, x);
                // Ties (up to rounding of the midpoint) may go either way.
                assert!(
                    (x - t[c]).abs() <= (x - t[n]).abs() + 1e-6,
                    "x={x} c={c} n={n}"
                );
            }
        }
        let cb = Codebook256::new(dynamic8());
        for i in -1100..=1100 {
            let x = i as f32 / 1000.0;
            let c = cb.encode(x) as usize;
            let n = nearest(&cb.values, x);
            assert!((x - cb.values[c]).abs() <= (x - cb.values[n]).abs() + 1e-6);
        }
    }
}
