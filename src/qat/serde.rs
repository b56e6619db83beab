//! Byte form of a [`QatOptimizer`] (behind Python pickling).
//!
//! Little-endian: magic `QATO`, `u32` version, `u8` dtype tag (1 = f32,
//! 2 = f64), target, scheme and rounding codes (`u8` each), five f64
//! hyper-parameters, seed and step (`u64`), `u64` length, a `u8` flag for
//! quant params followed (if set) by `f64` scale and `i32` zero point, qmin,
//! qmax; version 2 then a `u8` grid flag (0 per tensor, 1 deploy) followed
//! (if set) by `u64` out_features, in_features and group_size; then m, v
//! and the view as raw elements; finally a CRC32 of all preceding bytes.
//! Version 1 bytes (no grid field) read as the per-tensor grid. Decoding
//! checks every length before allocating.

use super::config::{IntDtype, QatConfig, QuantScheme, QuantTarget, RoundingMode};
use super::deploy::QatGrid;
use super::optimizer::{Master, QatOptimizer};
use super::params::QuantParams;
use crate::error::{QuantError, Result};
use crate::fp8::Fp8Format;

const MAGIC: &[u8; 4] = b"QATO";
const VERSION: u32 = 2;

const TARGETS: [QuantTarget; 4] = [
    QuantTarget::Int(IntDtype::Int8),
    QuantTarget::Int(IntDtype::Int4),
    QuantTarget::Fp8(Fp8Format::E4M3),
    QuantTarget::Fp8(Fp8Format::E5M2),
];

/// The dtype tag of serialized bytes (1 = f32, 2 = f64), after the header checks.
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn dtype_tag(bytes: &[u8]) -> Result<u8> {
    if bytes.len() < 9 || &bytes[..4] != MAGIC {
        return Err(QuantError::ser("not a QatOptimizer state (bad magic)"));
    }
    Ok(bytes[8])
}

impl<T: Master> QatOptimizer<T> {
    /// The byte form (see the module docs); `from_bytes` reads it back.
    pub fn to_bytes(&self) -> Vec<u8> {
        let n = self.quantized.len();
        let mut out = Vec::with_capacity(96 + 3 * n * T::BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        let c = &self.config;
        let target = TARGETS.iter().position(|&t| t == c.target).unwrap_or(0) as u8;
        out.extend_from_slice(&[
            T::TAG,
            target,
            (c.scheme == QuantScheme::Affine) as u8,
            (c.rounding == RoundingMode::Stochastic) as u8,
        ]);
        for x in [c.lr, c.beta1, c.beta2, c.eps, c.weight_decay] {
            out.extend_from_slice(&x.to_le_bytes());
        }
        for x in [self.seed, self.step, n as u64] {
            out.extend_from_slice(&x.to_le_bytes());
        }
        match &self.params {
            None => out.push(0),
            Some(p) => {
                out.push(1);
                out.extend_from_slice(&p.scale.to_le_bytes());
                for x in [p.zero_point, p.qmin, p.qmax] {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        match self.grid {
            QatGrid::PerTensor => out.push(0),
            QatGrid::Deploy(g) => {
                out.push(1);
                for x in [g.out_features, g.in_features, g.group_size] {
                    out.extend_from_slice(&(x as u64).to_le_bytes());
                }
            }
        }
        for buf in [&self.m[..], &self.v[..], self.quantized_slice()] {
            for &x in buf.iter() {
                x.write_le(&mut out);
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parse and validate bytes written by `to_bytes` (the error names what is wrong).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < 4 {
            return Err(QuantError::ser("truncated QatOptimizer state"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err(QuantError::ser("QatOptimizer state: CRC mismatch"));
        }
        let mut r = Reader { b: body, pos: 0 };
        if r.take(4)? != MAGIC {
            return Err(QuantError::ser("not a QatOptimizer state (bad magic)"));
        }
        let version = r.u32()?;
        if !(1..=VERSION).contains(&version) {
            return Err(QuantError::ser(format!(
                "unsupported QatOptimizer state version {version} (expected 1 to {VERSION})"
            )));
        }
        let h = r.take(4)?;
        if h[0] != T::TAG {
            return Err(QuantError::ser(format!(
                "state holds dtype tag {}, expected {} ({})",
                h[0],
                T::TAG,
                T::DTYPE
            )));
        }
        let target = *TARGETS
            .get(h[1] as usize)
            .ok_or_else(|| QuantError::ser(format!("bad target code {}", h[1])))?;
        let flag = |b: u8, what: &str| match b {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(QuantError::ser(format!("bad {what} code {b}"))),
        };
        let scheme = if flag(h[2], "scheme")? {
            QuantScheme::Affine
        } else {
            QuantScheme::Symmetric
        };
        let rounding = if flag(h[3], "rounding")? {
            RoundingMode::Stochastic
        } else {
            RoundingMode::Nearest
        };
        let config = QatConfig {
            target,
            scheme,
            rounding,
            lr: r.f64()?,
            beta1: r.f64()?,
            beta2: r.f64()?,
            eps: r.f64()?,
            weight_decay: r.f64()?,
        };
        let seed = r.u64()?;
        let step = r.u64()?;
        let n = r.u64()?;
        let params = if flag(r.take(1)?[0], "params flag")? {
            let scale = r.f64()?;
            let (zp, qmin, qmax) = (r.i32()?, r.i32()?, r.i32()?);
            Some(
                QuantParams::new(scale, zp, qmin, qmax)
                    .map_err(|e| QuantError::ser(e.to_string()))?,
            )
        } else {
            None
        };
        let grid = if version >= 2 && flag(r.take(1)?[0], "grid flag")? {
            let mut dim = || -> Result<usize> {
                usize::try_from(r.u64()?).map_err(|_| QuantError::ser("grid dimension too large"))
            };
            let (o, i, g) = (dim()?, dim()?, dim()?);
            QatGrid::deploy(o, i, g)
        } else {
            QatGrid::PerTensor
        };
        let need = (n as u128) * 3 * T::BYTES as u128;
        if need != (body.len() - r.pos) as u128 {
            return Err(QuantError::ser(format!(
                "length {n} needs {need} bytes of state, {} present",
                body.len() - r.pos
            )));
        }
        let n = n as usize;
        let mut read = || -> Result<Vec<T>> {
            let raw = r.take(n * T::BYTES)?;
            Ok(raw.chunks_exact(T::BYTES).map(T::read_le).collect())
        };
        let (m, v, q) = (read()?, read()?, read()?);
        QatOptimizer::from_parts_on(config, grid, seed, step, (m, v, q), params)
            .map_err(|e| QuantError::ser(format!("invalid QatOptimizer state: {e}")))
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, k: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(k)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| QuantError::ser("truncated QatOptimizer state"))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const K: usize>(&mut self) -> Result<[u8; K]> {
        let mut a = [0u8; K];
        a.copy_from_slice(self.take(K)?);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.arr()?))
    }
}
