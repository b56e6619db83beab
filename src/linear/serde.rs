//! The byte format of every layer's `serialize` (docs/linear.md).
//!
//! All integers little-endian:
//!
//! ```text
//! u32  version              (FORMAT_VERSION = 1)
//! u8   type tag             (the format's `FormatInfo::serde_tag`, crate::format)
//! u8   flags                (bit 0: a bias tensor follows; bit 1: an activation scale follows)
//! then the tensors the tag and flags name, in a fixed order, each as
//!   u64  byte length
//!   u8   dtype code         (DType below)
//!   u8   rank               (<= MAX_RANK)
//!   u64  dims[rank]
//!   raw bytes               (FP8 codes one byte per weight, f32 LE, ...)
//! u32  CRC32 (IEEE) of every preceding byte
//! ```
//!
//! The reader checks the CRC first, then every length against the bytes that
//! remain before it slices anything, so malformed input (truncated, bad
//! version or tag, overflowing or oversized lengths, CRC mismatch) is a
//! `QuantError::Serialization`, never a panic, and nothing is allocated
//! beyond the size of the input.

//!
//! The codec knows no format: the layers pass their format's tag, and the
//! registry's name lookup for the error messages.

use crate::error::{QuantError, Result};

/// The version every blob starts with.
pub const FORMAT_VERSION: u32 = 1;
/// Largest tensor rank a blob may hold.
pub const MAX_RANK: usize = 4;

/// Flag: a bias tensor follows the weight's tensors.
pub const FLAG_BIAS: u8 = 1;
/// Flag: an activation scale follows (FP8 layers).
pub const FLAG_ACT_SCALE: u8 = 2;

/// Element types of serialized tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DType {
    /// float32, little-endian.
    F32 = 0,
    /// FP8 E4M3 codes.
    F8E4M3 = 1,
    /// int8.
    I8 = 2,
    /// uint8 (packed codes).
    U8 = 3,
    /// uint32, little-endian.
    U32 = 4,
}

impl DType {
    fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F8E4M3 | DType::I8 | DType::U8 => 1,
        }
    }
}

/// Builds a blob: header, tensors, CRC.
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// A blob of layer type `tag` (a format's `FormatInfo::serde_tag`).
    pub fn new(tag: u8, flags: u8) -> Writer {
        let mut buf = Vec::new();
        buf.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        buf.push(tag);
        buf.push(flags);
        Writer { buf }
    }

    /// Append a tensor of `dims` whose raw bytes are `bytes`.
    pub fn tensor(&mut self, dtype: DType, dims: &[usize], bytes: &[u8]) {
        debug_assert_eq!(dims.iter().product::<usize>() * dtype.size(), bytes.len());
        self.buf
            .extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        self.buf.push(dtype as u8);
        self.buf.push(dims.len() as u8);
        for &d in dims {
            self.buf.extend_from_slice(&(d as u64).to_le_bytes());
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Append an f32 tensor.
    pub fn f32s(&mut self, dims: &[usize], v: &[f32]) {
        self.tensor(DType::F32, dims, &crate::st::f32_to_le(v));
    }

    /// The blob, with its CRC.
    pub fn finish(mut self) -> Vec<u8> {
        let crc = crc32fast::hash(&self.buf);
        self.buf.extend_from_slice(&crc.to_le_bytes());
        self.buf
    }
}

/// Reads a blob written by [`Writer`], validating everything.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The header's flags.
    pub flags: u8,
}

impl<'a> Reader<'a> {
    /// Check the CRC, version and tag; `expect` is the caller's layer type
    /// tag, `name_of` names the registered tags (for the messages).
    pub fn new(
        data: &'a [u8],
        expect: u8,
        name_of: fn(u8) -> Option<&'static str>,
    ) -> Result<Reader<'a>> {
        if data.len() < 10 {
            return Err(QuantError::ser(format!(
                "blob of {} bytes is shorter than the 10-byte minimum",
                data.len()
            )));
        }
        let (body, crc) = data.split_at(data.len() - 4);
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        let actual = crc32fast::hash(body);
        if stored != actual {
            return Err(QuantError::ser(format!(
                "CRC32 mismatch: stored {stored:#010x}, computed {actual:#010x} (corrupt or truncated)"
            )));
        }
        let version = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
        if version != FORMAT_VERSION {
            return Err(QuantError::ser(format!(
                "unsupported format version {version} (this build reads {FORMAT_VERSION})"
            )));
        }
        let tag = body[4];
        let Some(name) = name_of(tag) else {
            return Err(QuantError::ser(format!("unknown layer type tag {tag}")));
        };
        if tag != expect {
            let want = name_of(expect).unwrap_or("unregistered");
            return Err(QuantError::ser(format!(
                "blob holds a {name} layer, expected {want}"
            )));
        }
        let flags = body[5];
        if flags & !(FLAG_BIAS | FLAG_ACT_SCALE) != 0 {
            return Err(QuantError::ser(format!(
                "unknown flag bits in {flags:#04x}"
            )));
        }
        Ok(Reader {
            buf: body,
            pos: 6,
            flags,
        })
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                QuantError::ser(format!(
                    "{what}: needs {n} bytes at offset {}, only {} remain",
                    self.pos,
                    self.buf.len() - self.pos
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// The next tensor, which must have `dtype`; returns its dims and bytes.
    pub fn tensor(&mut self, name: &str, dtype: DType) -> Result<(Vec<usize>, &'a [u8])> {
        let len = self.u64(name)?;
        let head = self.take(2, name)?;
        let (code, rank) = (head[0], head[1] as usize);
        if code != dtype as u8 {
            return Err(QuantError::ser(format!(
                "{name}: dtype code {code}, expected {} ({dtype:?})",
                dtype as u8
            )));
        }
        if rank > MAX_RANK {
            return Err(QuantError::ser(format!("{name}: rank {rank} > {MAX_RANK}")));
        }
        let mut dims = Vec::with_capacity(rank);
        let mut count: u64 = 1;
        for _ in 0..rank {
            let d = self.u64(name)?;
            count = count
                .checked_mul(d)
                .ok_or_else(|| QuantError::ser(format!("{name}: dims overflow")))?;
            dims.push(
                usize::try_from(d)
                    .map_err(|_| QuantError::ser(format!("{name}: dim too large")))?,
            );
        }
        let want = count
            .checked_mul(dtype.size() as u64)
            .filter(|&w| w == len)
            .ok_or_else(|| {
                QuantError::ser(format!(
                    "{name}: byte length {len} does not match dims {dims:?}"
                ))
            })?;
        let n = usize::try_from(want).map_err(|_| QuantError::ser(format!("{name}: too large")))?;
        let bytes = self.take(n, name)?;
        Ok((dims, bytes))
    }

    /// The next tensor as f32 values.
    pub fn f32s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let (dims, b) = self.tensor(name, DType::F32)?;
        Ok((dims, crate::st::le_to_f32(b)?))
    }

    /// The next tensor as an f32 scalar (rank 0).
    pub fn scalar(&mut self, name: &str) -> Result<f32> {
        let (dims, v) = self.f32s(name)?;
        if !dims.is_empty() {
            return Err(QuantError::ser(format!(
                "{name}: expected a scalar, got dims {dims:?}"
            )));
        }
        Ok(v[0])
    }

    /// Every byte consumed?
    pub fn finish(self) -> Result<()> {
        if self.pos != self.buf.len() {
            return Err(QuantError::ser(format!(
                "{} trailing bytes after the last tensor",
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

/// Map any core error raised while rebuilding a layer from parsed bytes to a
/// serialization error (a blob that passes the CRC can still hold invalid
/// values, e.g. a zero scale).
pub fn as_ser<T>(r: Result<T>) -> Result<T> {
    r.map_err(|e| match e {
        QuantError::Serialization(_) => e,
        other => QuantError::ser(format!("invalid layer in blob: {other}")),
    })
}
