//! The CUDA placement of a linear layer (`layer.to("cuda")`,
//! `apply_isq(..., device="cuda")`): the layer's weight, scales and bias on
//! a device and its forward there.

use std::sync::Arc;

use pyo3::prelude::*;

use super::array::{DType, DeviceArray};
use super::device::gpu;
use super::input::{device_input, output};
use crate::error::QuantError;
use crate::gpu::layers::DeviceLinear;
use crate::linear::QuantMethod;

/// A linear layer on a GPU.
pub(crate) struct CudaLayer {
    pub(crate) inner: DeviceLinear,
}

impl CudaLayer {
    /// `layer` copied to CUDA device `ordinal`.
    pub(crate) fn from_layer(
        py: Python<'_>,
        layer: Arc<dyn QuantMethod>,
        ordinal: usize,
    ) -> PyResult<Self> {
        let g = gpu(py, ordinal)?;
        let layer = layer.into_layer();
        let inner = py.detach(|| DeviceLinear::from_layer(&g, &layer))?;
        Ok(CudaLayer { inner })
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.inner.gpu().ordinal
    }

    /// `y = x @ W.T + bias` for float32 `x [..., in]` on the device: NumPy in,
    /// NumPy out; a CUDA array in, a `DeviceArray` out.
    pub(crate) fn forward(&self, x: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let py = x.py();
        let l = &self.inner;
        let xi = device_input(l.gpu(), x, "x", DType::F32, "the layer")?;
        if xi.shape.last() != Some(&l.in_features()) {
            return Err(QuantError::dims(
                "x",
                format!("[..., {}]", l.in_features()),
                format!("{:?}", xi.shape),
            )
            .into());
        }
        let rows = xi.shape[..xi.shape.len() - 1].iter().product();
        let mut out_shape = xi.shape.clone();
        *out_shape.last_mut().expect("rank >= 1") = l.out_features();
        let mut y = DeviceArray::empty(l.gpu(), out_shape, DType::F32)?;
        let xv = xi.view::<f32>()?;
        let mut yv = y.view_mut::<f32>()?;
        py.detach(|| {
            l.forward(&xv, rows, &mut yv)
                .and_then(|_| l.gpu().synchronize())
        })?;
        output(py, y, xi.from_host)
    }
}
