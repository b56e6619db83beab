//! Saving and loading `QuantizedWeight` as safetensors: tensors `data` (U8,
//! `[num_pairs, out_feat]`) and `scales` (F32, `[num_groups, out_feat]`),
//! metadata `format = "quantrs.int4"`, `in_feat`, `out_feat`, `num_groups`,
//! `group_size`. The same bytes back pickling.

use std::collections::HashMap;
use std::path::Path;

use super::QuantizedWeight;
use crate::error::{QuantError, Result};
use crate::st::{self, Dtype};

const FORMAT: &str = "quantrs.int4";

impl QuantizedWeight {
    /// The safetensors encoding of this weight.
    pub fn to_safetensors_bytes(&self) -> Result<Vec<u8>> {
        let scales = st::f32_to_le(&self.scales);
        let meta = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("in_feat".to_string(), self.in_feat.to_string()),
            ("out_feat".to_string(), self.out_feat.to_string()),
            ("num_groups".to_string(), self.num_groups.to_string()),
            ("group_size".to_string(), self.group_size().to_string()),
        ]);
        st::to_bytes(
            &[
                (
                    "data",
                    Dtype::U8,
                    vec![self.num_pairs(), self.out_feat],
                    &self.data,
                ),
                (
                    "scales",
                    Dtype::F32,
                    vec![self.num_groups, self.out_feat],
                    &scales,
                ),
            ],
            meta,
        )
    }

    /// Parse and fully validate [`Self::to_safetensors_bytes`] output.
    pub fn from_safetensors_bytes(bytes: &[u8]) -> Result<Self> {
        let f = st::from_bytes(bytes)?;
        let format: String = f.meta("format")?;
        if format != FORMAT {
            return Err(QuantError::ser(format!(
                "metadata format: expected {FORMAT:?}, got {format:?}"
            )));
        }
        let in_feat: usize = f.meta("in_feat")?;
        let out_feat: usize = f.meta("out_feat")?;
        let num_groups: usize = f.meta("num_groups")?;
        let group_size: usize = f.meta("group_size")?;
        let data = f.get("data", Dtype::U8)?.data.clone();
        let scales = st::le_to_f32(&f.get("scales", Dtype::F32)?.data)?;
        let qw = QuantizedWeight::from_parts(data, scales, in_feat, out_feat, num_groups)
            .map_err(|e| QuantError::ser(format!("inconsistent INT4 tensors: {e}")))?;
        if qw.group_size() != group_size {
            return Err(QuantError::ser(format!(
                "metadata group_size {group_size} does not match the tensors ({})",
                qw.group_size()
            )));
        }
        Ok(qw)
    }

    /// Save to a safetensors file (atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        st::write_atomic(path, &self.to_safetensors_bytes()?)
    }

    /// Load from a safetensors file written by [`Self::save`].
    pub fn load(path: &Path) -> Result<Self> {
        Self::from_safetensors_bytes(&crate::atomic::read(path)?)
    }
}
