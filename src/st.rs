//! Small safetensors helpers shared by every type that saves itself:
//! atomic writes (temp file + fsync + rename) and validated reads.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView;
pub use safetensors::Dtype;
use safetensors::SafeTensors;

use crate::error::{QuantError, Result};

/// One tensor read from a file, with its bytes copied out.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnedTensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Everything read from a safetensors file.
#[derive(Clone, Debug, Default)]
pub struct StFile {
    pub tensors: HashMap<String, OwnedTensor>,
    pub metadata: HashMap<String, String>,
}

impl StFile {
    /// The tensor called `name`, with the expected dtype.
    pub fn get(&self, name: &str, dtype: Dtype) -> Result<&OwnedTensor> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| QuantError::ser(format!("missing tensor {name:?}")))?;
        if t.dtype != dtype {
            return Err(QuantError::ser(format!(
                "tensor {name:?}: expected dtype {dtype}, got {}",
                t.dtype
            )));
        }
        Ok(t)
    }

    /// The metadata entry `key`, parsed.
    pub fn meta<T: std::str::FromStr>(&self, key: &str) -> Result<T> {
        let v = self
            .metadata
            .get(key)
            .ok_or_else(|| QuantError::ser(format!("missing metadata {key:?}")))?;
        v.parse()
            .map_err(|_| QuantError::ser(format!("metadata {key:?}: cannot parse {v:?}")))
    }
}

/// Serialize tensors `(name, dtype, shape, bytes)` to safetensors bytes.
pub fn to_bytes(
    tensors: &[(&str, Dtype, Vec<usize>, &[u8])],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.to_string(), v))
                .map_err(|e| QuantError::ser(format!("tensor {name:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = if metadata.is_empty() {
        None
    } else {
        Some(metadata)
    };
    let bytes = safetensors::serialize(views, meta).map_err(|e| QuantError::ser(e.to_string()))?;
    Ok(canonical_header(bytes))
}

/// The same file with its JSON header's keys in sorted order: the
/// safetensors crate writes `__metadata__` from a `HashMap`, whose order
/// changes per call, and the same object must give the same bytes. Only the
/// order changes, so the text keeps its length and padding.
fn canonical_header(mut bytes: Vec<u8>) -> Vec<u8> {
    let Some(n) = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize)
    else {
        return bytes;
    };
    let Some(raw) = bytes.get(8..8 + n) else {
        return bytes;
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(raw) else {
        return bytes;
    };
    let text = v.to_string();
    if text.len() <= n {
        let header = &mut bytes[8..8 + n];
        header[..text.len()].copy_from_slice(text.as_bytes());
        header[text.len()..].fill(b' ');
    }
    bytes
}

/// Parse safetensors bytes, copying each tensor out.
pub fn from_bytes(bytes: &[u8]) -> Result<StFile> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| QuantError::ser(format!("not a valid safetensors file: {e}")))?;
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| QuantError::ser(format!("not a valid safetensors file: {e}")))?;
    let mut out = StFile {
        metadata: header.metadata().clone().unwrap_or_default(),
        ..Default::default()
    };
    for (name, view) in st.tensors() {
        out.tensors.insert(
            name,
            OwnedTensor {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data().to_vec(),
            },
        );
    }
    Ok(out)
}

/// Write `bytes` to `path` atomically (unique temporary + fsync + rename;
/// see `crate::atomic`).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::atomic::write(path, bytes)
}

/// Load a whole safetensors file.
pub fn load(path: &Path) -> Result<StFile> {
    from_bytes(&crate::atomic::read(path)?)
}

/// f32 values as little-endian bytes.
pub fn f32_to_le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes as f32 values; the length must be a multiple of 4.
pub fn le_to_f32(b: &[u8]) -> Result<Vec<f32>> {
    if !b.len().is_multiple_of(4) {
        return Err(QuantError::ser(format!(
            "f32 buffer of {} bytes is not a multiple of 4",
            b.len()
        )));
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
