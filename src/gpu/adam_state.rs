//! One parameter's 4-bit Adam state in device memory, laid out as
//! `optim::ParamState` (codes, block scales or their double-quantized codes
//! and group pairs, rank-1 statistics), with its copies to and from the host
//! and the addresses the step kernel takes.

use std::sync::Arc;

use super::adam::StateAddrs;
use super::context::Gpu;
use super::memory::DeviceBuffer;
use crate::error::{QuantError, Result};
use crate::optim::{ParamState, Scales, VScales};

/// Block scales of one moment on the device.
pub(crate) enum DevScales {
    F32(DeviceBuffer),
    Double {
        codes: DeviceBuffer,
        groups: DeviceBuffer,
    },
}

/// v's scales on the device (`rows_new` / `cols_new`: the step's scratch).
pub(crate) enum DevV {
    Block(DevScales),
    Rank1 {
        rows: DeviceBuffer,
        cols: DeviceBuffer,
        rows_new: DeviceBuffer,
        cols_new: DeviceBuffer,
    },
}

/// One parameter's state on the device, laid out as `optim::ParamState`.
pub(crate) struct DevParam {
    pub(crate) shape: Vec<usize>,
    m_codes: DeviceBuffer,
    v_codes: DeviceBuffer,
    m: DevScales,
    v: DevV,
}

fn up_scales(gpu: &Arc<Gpu>, s: &Scales) -> Result<DevScales> {
    Ok(match s {
        Scales::F32(v) => DevScales::F32(DeviceBuffer::from_host(gpu, v)?),
        Scales::Double { codes, groups } => DevScales::Double {
            codes: DeviceBuffer::from_host(gpu, codes)?,
            groups: DeviceBuffer::from_host(gpu, groups)?,
        },
    })
}

fn down_scales(s: &DevScales) -> Result<Scales> {
    Ok(match s {
        DevScales::F32(b) => Scales::F32(b.to_host()?),
        DevScales::Double { codes, groups } => Scales::Double {
            codes: codes.to_host()?,
            groups: groups.to_host()?,
        },
    })
}

fn scales_bytes(s: &DevScales) -> usize {
    match s {
        DevScales::F32(b) => b.bytes(),
        DevScales::Double { codes, groups } => codes.bytes() + groups.bytes(),
    }
}

impl DevParam {
    pub(crate) fn upload(gpu: &Arc<Gpu>, st: &ParamState) -> Result<DevParam> {
        if st.rows.is_some() {
            // The device kernels group 256 blocks over the flat tensor.
            return Err(QuantError::UnsupportedOperation(
                "the row layout of a sharded parameter's state runs on the CPU only".into(),
            ));
        }
        let v = match &st.v_scales {
            VScales::Block(s) => DevV::Block(up_scales(gpu, s)?),
            VScales::Rank1 { rows, cols } => DevV::Rank1 {
                rows: DeviceBuffer::from_host(gpu, rows)?,
                cols: DeviceBuffer::from_host(gpu, cols)?,
                rows_new: DeviceBuffer::alloc(gpu, 4 * rows.len())?,
                cols_new: DeviceBuffer::alloc(gpu, 4 * cols.len())?,
            },
        };
        Ok(DevParam {
            shape: st.shape.clone(),
            m_codes: DeviceBuffer::from_host(gpu, &st.m_codes)?,
            v_codes: DeviceBuffer::from_host(gpu, &st.v_codes)?,
            m: up_scales(gpu, &st.m_scales)?,
            v,
        })
    }

    pub(crate) fn download(&self) -> Result<ParamState> {
        let v_scales = match &self.v {
            DevV::Block(s) => VScales::Block(down_scales(s)?),
            DevV::Rank1 { rows, cols, .. } => VScales::Rank1 {
                rows: rows.to_host()?,
                cols: cols.to_host()?,
            },
        };
        Ok(ParamState {
            shape: self.shape.clone(),
            m_codes: self.m_codes.to_host()?,
            v_codes: self.v_codes.to_host()?,
            m_scales: down_scales(&self.m)?,
            v_scales,
            rows: None,
        })
    }

    /// Bytes of the state proper (the rank-1 scratch is not state).
    pub(crate) fn bytes(&self) -> usize {
        let v = match &self.v {
            DevV::Block(s) => scales_bytes(s),
            DevV::Rank1 { rows, cols, .. } => rows.bytes() + cols.bytes(),
        };
        self.m_codes.bytes() + self.v_codes.bytes() + scales_bytes(&self.m) + v
    }

    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub(crate) fn addrs(&self) -> StateAddrs {
        let mut s = StateAddrs {
            m_codes: self.m_codes.ptr(),
            v_codes: self.v_codes.ptr(),
            ..Default::default()
        };
        match &self.m {
            DevScales::F32(b) => s.m_scales = b.ptr(),
            DevScales::Double { codes, groups } => {
                s.m_scale_codes = codes.ptr();
                s.m_groups = groups.ptr();
            }
        }
        match &self.v {
            DevV::Block(DevScales::F32(b)) => s.v_scales = b.ptr(),
            DevV::Block(DevScales::Double { codes, groups }) => {
                s.v_scale_codes = codes.ptr();
                s.v_groups = groups.ptr();
            }
            DevV::Rank1 {
                rows,
                cols,
                rows_new,
                cols_new,
            } => {
                s.rows = rows.ptr();
                s.cols = cols.ptr();
                s.rows_new = rows_new.ptr();
                s.cols_new = cols_new.ptr();
            }
        }
        s
    }

    pub(crate) fn rank1(&self) -> bool {
        matches!(self.v, DevV::Rank1 { .. })
    }
}
