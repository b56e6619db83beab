//! `quantrs.cuda.CudaQuantizedWeight`: what `QuantizedWeight.to("cuda")`
//! returns (INT4 matvec / matmul on the device).

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::array::{DType, DeviceArray};
use super::device::gpu;
use super::input::{device_input, output};
use crate::error::QuantError;
use crate::gpu::layers::DeviceQuantizedWeight;
use crate::linear::Device;
use crate::python::int4::PyQuantizedWeight;

/// Packed INT4 weights on a GPU (`QuantizedWeight.to("cuda")`). Pickling
/// and `to_bytes` give exactly the bytes of the CPU twin.
#[pyclass(name = "CudaQuantizedWeight", module = "quantrs.cuda", frozen)]
pub struct CudaQuantizedWeight {
    pub(super) inner: DeviceQuantizedWeight,
}

/// `QuantizedWeight.to(device)`.
pub(crate) fn quantized_weight_to<'py>(
    slf: &Bound<'py, PyAny>,
    device: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    match super::parse_device(device)? {
        Device::Cpu => Ok(slf.clone()),
        Device::Cuda(i) => {
            let g = gpu(py, i)?;
            let w = slf.cast::<PyQuantizedWeight>()?;
            let cpu = &w.get().inner;
            let inner = py.detach(|| DeviceQuantizedWeight::from_cpu(&g, cpu))?;
            Ok(Bound::new(py, CudaQuantizedWeight { inner })?.into_any())
        }
    }
}

impl CudaQuantizedWeight {
    fn to_cpu(&self, py: Python<'_>) -> PyResult<PyQuantizedWeight> {
        Ok(PyQuantizedWeight {
            inner: py.detach(|| self.inner.to_cpu())?,
        })
    }

    fn run<'py>(&self, x: &Bound<'py, PyAny>, vector: bool) -> PyResult<Py<PyAny>> {
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

#[pymethods]
impl CudaQuantizedWeight {
    /// `y = W^T x`: `x [in_feat]` -> `[out_feat]`.
    fn matvec(&self, x: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.run(x, true)
    }

    /// `Y = X W`: `x [batch, in_feat]` -> `[batch, out_feat]` (a tiled
    /// GEMM from batch 9 on, the split-K matvec below).
    fn matmul(&self, x: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.run(x, false)
    }

    /// A copy on `device`: "cpu" gives a `QuantizedWeight`.
    fn to<'py>(slf: &Bound<'py, Self>, device: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        match super::parse_device(device)? {
            Device::Cpu => Ok(Bound::new(py, slf.get().to_cpu(py)?)?.into_any()),
            Device::Cuda(i) if i == slf.get().inner.gpu().ordinal => Ok(slf.clone().into_any()),
            Device::Cuda(i) => {
                let cpu = slf.get().to_cpu(py)?;
                let g = gpu(py, i)?;
                let inner = py.detach(|| DeviceQuantizedWeight::from_cpu(&g, &cpu.inner))?;
                Ok(Bound::new(py, CudaQuantizedWeight { inner })?.into_any())
            }
        }
    }

    /// The weight as a new float32 NumPy array `[in_feat, out_feat]`.
    fn dequantize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Bound::new(py, self.to_cpu(py)?)?.call_method0("dequantize")
    }

    /// The safetensors bytes of the CPU twin's `to_bytes`.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.to_cpu(py)?.inner.to_safetensors_bytes()?;
        Ok(PyBytes::new(py, &b))
    }

    /// Pickles as the CPU twin (same bytes); unpickling gives a CPU object.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Bound::new(py, self.to_cpu(py)?)?.call_method0("__reduce__")
    }

    #[getter]
    fn in_feat(&self) -> usize {
        self.inner.in_feat()
    }

    #[getter]
    fn out_feat(&self) -> usize {
        self.inner.out_feat()
    }

    #[getter]
    fn num_groups(&self) -> usize {
        self.inner.num_groups()
    }

    #[getter]
    fn group_size(&self) -> usize {
        self.inner.group_size()
    }

    /// Device bytes of packed data plus scales.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    #[getter]
    fn device(&self) -> String {
        format!("cuda:{}", self.inner.gpu().ordinal)
    }

    fn __repr__(&self) -> String {
        let w = &self.inner;
        format!(
            "CudaQuantizedWeight(in_feat={}, out_feat={}, num_groups={}, group_size={}, device='cuda:{}')",
            w.in_feat(),
            w.out_feat(),
            w.num_groups(),
            w.group_size(),
            w.gpu().ordinal
        )
    }
}
