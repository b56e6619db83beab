//! The CUDA placement of a `quantrs.QuantizedWeight` (`.to("cuda")`): the
//! packed weight on a device and its INT4 matvec / matmul there.

use pyo3::prelude::*;

use super::array::{DType, DeviceArray};
use super::device::gpu;
use super::input::{device_input, output};
use crate::error::QuantError;
use crate::gpu::layers::DeviceQuantizedWeight;
use crate::int4::QuantizedWeight as Core;

/// Packed INT4 weights on a GPU.
pub(crate) struct CudaWeight {
    pub(crate) inner: DeviceQuantizedWeight,
}

impl CudaWeight {
    /// `w` copied to CUDA device `ordinal`.
    pub(crate) fn from_cpu(py: Python<'_>, w: &Core, ordinal: usize) -> PyResult<Self> {
        let g = gpu(py, ordinal)?;
        let inner = py.detach(|| DeviceQuantizedWeight::from_cpu(&g, w))?;
        Ok(CudaWeight { inner })
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.inner.gpu().ordinal
    }

    /// `y = W^T x` (`vector`: `x [in_feat]`) or `Y = X W` (`x [batch,
    /// in_feat]`) on the device: NumPy in, NumPy out; a CUDA array in, a
    /// `DeviceArray` out.
    pub(crate) fn run<'py>(&self, x: &Bound<'py, PyAny>, vector: bool) -> PyResult<Py<PyAny>> {
        let py = x.py();
        let w = &self.inner;
        let xi = device_input(w.gpu(), x, "x", DType::F32, "the weight")?;
        let (batch, out_shape) = if vector {
            if xi.shape != [w.in_feat()] {
                return Err(QuantError::dims(
                    "x",
                    format!("[{}]", w.in_feat()),
                    format!("{:?}", xi.shape),
                )
                .into());
            }
            (1, vec![w.out_feat()])
        } else {
            if xi.shape.len() != 2 || xi.shape[1] != w.in_feat() {
                return Err(QuantError::dims(
                    "x",
                    format!("[batch, {}]", w.in_feat()),
                    format!("{:?}", xi.shape),
                )
                .into());
            }
            (xi.shape[0], vec![xi.shape[0], w.out_feat()])
        };
        let mut y = DeviceArray::empty(w.gpu(), out_shape, DType::F32)?;
        let xv = xi.view::<f32>()?;
        let mut yv = y.view_mut::<f32>()?;
        py.detach(|| {
            w.matmul(&xv, batch, &mut yv)
                .and_then(|_| w.gpu().synchronize())
        })?;
        output(py, y, xi.from_host)
    }
}
