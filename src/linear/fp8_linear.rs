//! `PerTensorFP8Linear`: E4M3 weight codes `[out, in]` (or
//! expert-stacked `[E, out, in]`), one byte per weight, with a per-tensor
//! dequantization multiplier `weight_scale_inv` (`W = decode(codes) * s_w`),
//! an optional static activation scale `s_a` and an optional f32 bias.
//!
//! - With `s_a` (W8A8, the static-activation path of per-tensor FP8
//!   checkpoints): `xq = encode(x / s_a, saturate)` (a true division),
//!   `y = (dec(xq) . dec(Wq)^T) * (s_a * s_w) + bias`, products of decoded FP8
//!   values accumulated in f32.
//! - Without it (W8A32): `y = (x . dec(Wq)^T) * s_w + bias`.

use std::borrow::Cow;
use std::path::Path;

use super::common::OutPtr;
use super::e4m3_round::div_round_e4m3;
use super::kernels::{matmul_rows, matmul_rows_in_range, Epilogue};
use super::serde::{self as ser, DType, Reader, Writer, FLAG_ACT_SCALE, FLAG_BIAS};
use super::stats::Stats;
use super::{check_bias, rows_in, rows_of, Device, Layer, QuantMethod, WeightDType};
use crate::error::{QuantError, Result};
use crate::format::{
    check_codes, check_float_weight, check_scale, dequantize_e4m3, quantize_e4m3, E4m3Rows,
    FormatId, Fp8E4M3, WeightFormat,
};
use crate::fp8::Fp8Format;
use crate::st;

const FMT: Fp8Format = Fp8Format::E4M3;

/// The activations the E4M3 rows multiply and the multiplier of every
/// output: `x` and `s_w` (W8A32), or `x` on the E4M3 grid of `s_a` and
/// `s_a * s_w` (W8A8; see the module docs).
pub(crate) fn prepare_fp8(
    x: &[f32],
    activation_scale: Option<f32>,
    weight_scale_inv: f32,
) -> (Cow<'_, [f32]>, f32) {
    match activation_scale {
        None => (Cow::Borrowed(x), weight_scale_inv),
        Some(a) => {
            // One pass over `x`, each value divided and rounded in float32
            // (`e4m3_round.rs`: the codec's encode-then-decode, without the
            // codes and the decode's table gather). Small inputs (a decode
            // step's) stay on the calling thread; larger ones go to
            // `par::for_each_block`, where the caller starts at once rather
            // than sleeping until a rayon job is done (a prefill call's
            // rounding is a few tens of microseconds).
            let mut q = vec![0f32; x.len()];
            if x.len() < PREPARE_PAR_MIN {
                q.chunks_mut(PREPARE_PIECE)
                    .zip(x.chunks(PREPARE_PIECE))
                    .for_each(|(qc, xc)| div_round_e4m3(xc, a, qc));
            } else {
                let (out, len) = (OutPtr(q.as_mut_ptr()), x.len());
                crate::par::for_each_block(len.div_ceil(PREPARE_PIECE), |p| {
                    let o = out;
                    let r = p * PREPARE_PIECE..((p + 1) * PREPARE_PIECE).min(len);
                    // SAFETY: piece `p` alone writes `q[r]`, and `r` lies in
                    // `q` (`len` long), which outlives the call.
                    let qc = unsafe { std::slice::from_raw_parts_mut(o.0.add(r.start), r.len()) };
                    div_round_e4m3(&x[r], a, qc);
                });
            }
            (Cow::Owned(q), a * weight_scale_inv)
        }
    }
}

/// Activations per piece of the W8A8 rounding (16 KiB of f32, in L1).
const PREPARE_PIECE: usize = 4096;
/// Activations from which the W8A8 rounding runs on the pool.
const PREPARE_PAR_MIN: usize = 1 << 16;

/// Per-tensor FP8 linear layer with optional static activation scaling.
///
/// ```
/// use ndarray::{array, ArrayD, IxDyn};
/// use quantrs::{PerTensorFP8Linear, QuantMethod};
///
/// // E4M3 codes 0x38 = 1.0, 0x40 = 2.0; weight [out 1, in 2] times 0.5.
/// let layer = PerTensorFP8Linear::new(vec![0x38, 0x40], vec![1, 2], 0.5, None, None)?;
/// assert_eq!(layer.dequantize_w()?, array![[0.5f32, 1.0]].into_dyn());
/// let x = ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1.0f32, 1.0, 2.0, 0.0]).unwrap();
/// assert_eq!(layer.forward(x.view())?, array![[1.5f32], [1.0]].into_dyn());
/// # Ok::<(), quantrs::QuantError>(())
/// ```
#[derive(Clone, Debug)]
pub struct PerTensorFP8Linear {
    weight: Vec<u8>,
    shape: Vec<usize>,
    weight_scale_inv: f32,
    activation_scale: Option<f32>,
    bias: Option<Vec<f32>>,
    merge_error: Option<f64>,
    stats: Stats,
}

fn check_shape(shape: &[usize]) -> Result<()> {
    if !(shape.len() == 2 || shape.len() == 3) {
        return Err(QuantError::dims(
            "weight rank",
            "2 ([out, in]) or 3 ([E, out, in])",
            shape.len(),
        ));
    }
    if shape.contains(&0) {
        return Err(QuantError::arg(format!("weight shape {shape:?} is empty")));
    }
    if shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .is_none()
    {
        return Err(QuantError::arg(format!("weight shape {shape:?} overflows")));
    }
    Ok(())
}

impl PerTensorFP8Linear {
    /// Build from E4M3 codes `weight` of `shape` (`[out, in]` or
    /// `[E, out, in]`). Scales must be finite and > 0; NaN codes (0x7F,
    /// 0xFF) are rejected; `bias` is `[out]` (or `[E, out]`).
    pub fn new(
        weight: Vec<u8>,
        shape: Vec<usize>,
        weight_scale_inv: f32,
        activation_scale: Option<f32>,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        check_shape(&shape)?;
        let n: usize = shape.iter().product();
        if weight.len() != n {
            return Err(QuantError::dims("weight length", n, weight.len()));
        }
        check_scale("weight_scale_inv", weight_scale_inv)?;
        if let Some(a) = activation_scale {
            check_scale("activation_scale", a)?;
        }
        check_bias(bias.as_deref(), n / shape[shape.len() - 1])?;
        check_codes(&weight)?;
        // A batch-1 forward streams the codes from DRAM on every call.
        crate::hugepages::advise(&weight);
        Ok(PerTensorFP8Linear {
            weight,
            shape,
            weight_scale_inv,
            activation_scale,
            bias,
            merge_error: None,
            stats: Stats::default(),
        })
    }

    /// Quantize a float weight: `weight_scale_inv = absmax / 448` (1.0 for
    /// an all-zero weight), codes `encode(w / scale, saturate=True)`.
    pub fn from_float(
        w: &[f32],
        shape: Vec<usize>,
        bias: Option<Vec<f32>>,
        activation_scale: Option<f32>,
    ) -> Result<Self> {
        check_shape(&shape)?;
        check_float_weight(w, &shape)?;
        let (codes, scale) = quantize_e4m3(w);
        Self::new(codes, shape, scale, activation_scale, bias)
    }

    /// Load the per-tensor FP8 layer `prefix` from a safetensors file, in any
    /// of the dialects of `fp8_dialect` (compressed-tensors, AutoFP8,
    /// mistral.rs): `<prefix>.weight` F8_E4M3 `[out, in]` (or `[E, out, in]`),
    /// its scale, the optional activation scale and bias.
    pub fn from_safetensors(path: &Path, prefix: &str) -> Result<Self> {
        let p = super::fp8_dialect::read_per_tensor(&st::load(path)?, prefix)?;
        Self::new(p.codes, p.shape, p.weight_scale, p.activation_scale, p.bias)
    }

    /// The E4M3 codes.
    pub fn weight(&self) -> &[u8] {
        &self.weight
    }
    /// The weight's shape (`[out, in]` or `[E, out, in]`).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The per-tensor dequantization multiplier of the codes.
    pub fn weight_scale_inv(&self) -> f32 {
        self.weight_scale_inv
    }
    /// The static activation scale (W8A8), if any.
    pub fn activation_scale(&self) -> Option<f32> {
        self.activation_scale
    }

    /// The activations the kernels see (quantized onto the E4M3 grid when an
    /// activation scale is set) and the multiplier applied after the dot.
    fn prepare<'a>(&self, x: &'a [f32]) -> (Cow<'a, [f32]>, f32) {
        prepare_fp8(x, self.activation_scale, self.weight_scale_inv)
    }

    fn expert_forward(&self, e: usize, x: &[f32], rows: usize, mult: f32, y: &mut [f32]) {
        let (out, k) = (self.out_features(), self.in_features());
        let codes = &self.weight[e * out * k..(e + 1) * out * k];
        let bias = self.bias.as_deref().map(|b| &b[e * out..(e + 1) * out]);
        let epi = Epilogue {
            scale: &|_| mult,
            bias,
        };
        let rows_src = E4m3Rows { codes, k };
        if self.activation_scale.is_some() {
            // `x` is on the E4M3 grid (`prepare`): |x| <= 448, always in
            // the range the check looks for.
            matmul_rows_in_range(&rows_src, out, k, x, rows, y, &epi);
        } else {
            matmul_rows(&rows_src, out, k, x, rows, y, &epi);
        }
    }

    /// The same kind of layer (shape, bias, activation scale) for `w`.
    fn rebuilt(&self, w: &[f32]) -> Result<Self> {
        Self::from_float(
            w,
            self.shape.clone(),
            self.bias.clone(),
            self.activation_scale,
        )
    }

    fn write(&self, bias: Option<&[f32]>) -> Vec<u8> {
        let mut flags = 0;
        if bias.is_some() {
            flags |= FLAG_BIAS;
        }
        if self.activation_scale.is_some() {
            flags |= FLAG_ACT_SCALE;
        }
        let mut w = Writer::new(Fp8E4M3::INFO.serde_tag, flags);
        w.tensor(DType::F8E4M3, &self.shape, &self.weight);
        w.f32s(&[], &[self.weight_scale_inv]);
        if let Some(a) = self.activation_scale {
            w.f32s(&[], &[a]);
        }
        if let Some(b) = bias {
            w.f32s(&self.shape[..self.shape.len() - 1], b);
        }
        w.finish()
    }

    fn read(data: &[u8]) -> Result<(Self, Option<Vec<f32>>)> {
        let mut r = Reader::new(data, Fp8E4M3::INFO.serde_tag, FormatId::serde_name_of)?;
        let (shape, codes) = r.tensor("weight", DType::F8E4M3)?;
        let s_w = r.scalar("weight_scale_inv")?;
        let s_a = match r.flags & FLAG_ACT_SCALE {
            0 => None,
            _ => Some(r.scalar("activation_scale")?),
        };
        let bias = match r.flags & FLAG_BIAS {
            0 => None,
            _ => {
                let (dims, b) = r.f32s("bias")?;
                if shape.len() < 2 || dims[..] != shape[..shape.len() - 1] {
                    return Err(QuantError::ser(format!(
                        "bias dims {dims:?} do not match weight dims {shape:?}"
                    )));
                }
                Some(b)
            }
        };
        r.finish()?;
        let layer = ser::as_ser(Self::new(codes.to_vec(), shape, s_w, s_a, None))?;
        if let Some(b) = &bias {
            ser::as_ser(check_bias(
                Some(b),
                layer.weight.len() / layer.in_features(),
            ))?;
        }
        Ok((layer, bias))
    }
}

impl QuantMethod for PerTensorFP8Linear {
    fn weight_shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    fn forward_slice(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        if self.shape.len() == 3 {
            return Err(QuantError::UnsupportedOperation(format!(
                "forward on expert-stacked weights {:?}: use gather_forward",
                self.shape
            )));
        }
        let rows = rows_of(x, y, self.in_features(), self.out_features())?;
        self.stats.observe(x, self.in_features());
        let (xs, mult) = self.prepare(x);
        self.expert_forward(0, &xs, rows, mult, y);
        Ok(())
    }

    fn gather_forward_slice(
        &self,
        x: &[f32],
        indices: &[i64],
        k: usize,
        y: &mut [f32],
    ) -> Result<()> {
        if self.shape.len() != 3 {
            return Err(QuantError::UnsupportedOperation(format!(
                "gather_forward needs expert-stacked [E, out, in] weights, this layer holds {:?}",
                self.shape
            )));
        }
        let (n_exp, out, inf) = (self.shape[0], self.shape[1], self.shape[2]);
        let tokens = rows_in(x, inf)?;
        if Some(indices.len()) != tokens.checked_mul(k) {
            return Err(QuantError::dims(
                "indices",
                format!("[{tokens}, {k}]"),
                format!("{} elements", indices.len()),
            ));
        }
        if Some(y.len()) != tokens.checked_mul(k).and_then(|v| v.checked_mul(out)) {
            return Err(QuantError::dims("y length", tokens * k * out, y.len()));
        }
        if let Some(p) = indices
            .iter()
            .position(|&e| e < 0 || e as u64 >= n_exp as u64)
        {
            return Err(QuantError::arg(format!(
                "indices[{}, {}] = {} is out of range for {n_exp} experts",
                p / k.max(1),
                p % k.max(1),
                indices[p]
            )));
        }
        self.stats.observe(x, inf);
        let (xs, mult) = self.prepare(x);
        // Group the (token, slot) pairs by expert; run each expert once over
        // its rows (a batched forward), then scatter.
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); n_exp];
        for (p, &e) in indices.iter().enumerate() {
            by_expert[e as usize].push(p);
        }
        for (e, slots) in by_expert.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
            let mut xe = Vec::with_capacity(slots.len() * inf);
            for &p in slots {
                let t = p / k;
                xe.extend_from_slice(&xs[t * inf..(t + 1) * inf]);
            }
            let mut ye = vec![0f32; slots.len() * out];
            self.expert_forward(e, &xe, slots.len(), mult, &mut ye);
            for (i, &p) in slots.iter().enumerate() {
                y[p * out..(p + 1) * out].copy_from_slice(&ye[i * out..(i + 1) * out]);
            }
        }
        Ok(())
    }

    fn dequantize_w_vec(&self) -> Result<Vec<f32>> {
        Ok(dequantize_e4m3(&self.weight, self.weight_scale_inv))
    }

    fn quantized_act_type(&self) -> Option<Fp8Format> {
        self.activation_scale.map(|_| FMT)
    }

    fn dtype_and_device(&self) -> (WeightDType, Device) {
        (WeightDType::F8E4M3, Device::Cpu)
    }

    fn into_layer(self: std::sync::Arc<Self>) -> Layer {
        Layer::Fp8(self)
    }

    shared_quant_method_items!(s => s.in_features());
}

impl_quantized_serde!(PerTensorFP8Linear, "pertensor-fp8-linear", s => s.weight.len() / s.in_features());

#[cfg(test)]
mod tests {
    use super::super::e4m3_round::round_e4m3_sat;
    use super::*;
    use crate::testutil::{on_one_thread, xorshift_f32};

    /// The W8A8 rounding of `x` on every size path (the calling thread
    /// alone, and the fork-join from `PREPARE_PAR_MIN` with a last piece
    /// shorter than `PREPARE_PIECE`) equals the scalar rounding of each
    /// `x / s_a`, on one thread as on the pool; saturation included.
    #[test]
    fn w8a8_rounding_matches_scalar_on_every_path() {
        let (a, s_w_inv) = (4.0f32 / 448.0, 0.25f32);
        for len in [
            1usize,
            4095,
            4097,
            PREPARE_PAR_MIN - 1,
            PREPARE_PAR_MIN,
            3 * PREPARE_PIECE * 7 + 37,
        ] {
            let x = xorshift_f32(7 + len as u64, len, 6.0);
            let want: Vec<f32> = x.iter().map(|&v| round_e4m3_sat(v / a)).collect();
            let (q, mult) = prepare_fp8(&x, Some(a), s_w_inv);
            assert_eq!(mult, a * s_w_inv);
            let same = |got: &[f32], what: &str| {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "len {len} [{i}] {what}");
                }
                assert_eq!(got.len(), want.len());
            };
            same(&q, "pool");
            let q1 = on_one_thread(|| prepare_fp8(&x, Some(a), s_w_inv).0.into_owned());
            same(&q1, "one thread");
            if len > 1000 {
                assert!(
                    want.iter().any(|v| v.abs() == 448.0),
                    "len {len}: saturates"
                );
            }
        }
        let x = [1.5f32, -2.0];
        let (q, mult) = prepare_fp8(&x, None, s_w_inv);
        assert!(matches!(q, Cow::Borrowed(_)) && *q == x && mult == s_w_inv);
    }
}
