//! Small safetensors helpers shared by every type that saves itself:
//! atomic writes (temp file + fsync + rename) and validated reads.

use std::collections::HashMap;
use std::io::Write;
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
    safetensors::serialize(views, meta).map_err(|e| QuantError::ser(e.to_string()))
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

/// Write `bytes` to `path` atomically: a temporary file in the same folder,
/// fsync, then rename over the target. A crash leaves the old file intact.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| QuantError::arg(format!("path {path:?} names no file")))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Load a whole safetensors file.
pub fn load(path: &Path) -> Result<StFile> {
    from_bytes(&std::fs::read(path)?)
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
