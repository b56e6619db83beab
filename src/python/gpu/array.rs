//! `quantrs.cuda.DeviceArray`: a C-contiguous array in device memory, its
//! NumPy copies both ways and its DLPack export (the conversion of call
//! inputs is `input.rs`).

use std::sync::Arc;

use numpy::{PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::device::gpu;
use super::dlpack::{self, DLDataType, DL_CUDA, DL_FLOAT, DL_INT, DL_UINT};
use crate::error::QuantError;
use crate::gpu::context::Gpu;
use crate::gpu::memory::DeviceBuffer;
use crate::python::arrays::numpy_module;
use crate::python::errors::{invalid, wrong_dtype};

/// Element types a `DeviceArray` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    /// float64: the QAT optimizer's masters, moments and view.
    F64,
    U8,
    I8,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::U8 => "uint8",
            DType::I8 => "int8",
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
            DType::U8 | DType::I8 => 1,
        }
    }

    pub fn dl(self) -> DLDataType {
        let (code, bits) = match self {
            DType::F32 => (DL_FLOAT, 32),
            DType::F64 => (DL_FLOAT, 64),
            DType::U8 => (DL_UINT, 8),
            DType::I8 => (DL_INT, 8),
        };
        DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }

    pub(super) fn from_dl(t: DLDataType) -> Option<DType> {
        [DType::F32, DType::F64, DType::U8, DType::I8]
            .into_iter()
            .find(|d| d.dl() == t)
    }

    fn from_name(name: &str) -> Option<DType> {
        match name {
            "float32" => Some(DType::F32),
            "float64" => Some(DType::F64),
            "uint8" => Some(DType::U8),
            "int8" => Some(DType::I8),
            _ => None,
        }
    }
}

pub(super) fn describe_dl(t: DLDataType) -> String {
    let kind = match t.code {
        DL_INT => "int",
        DL_UINT => "uint",
        DL_FLOAT => "float",
        4 => "bfloat",
        _ => "code",
    };
    if t.lanes == 1 {
        format!("{kind}{}", t.bits)
    } else {
        format!("{kind}{}x{}", t.bits, t.lanes)
    }
}

/// A C-contiguous array in device memory (float32, float64, uint8 or int8).
#[pyclass(name = "DeviceArray", module = "quantrs.cuda", frozen)]
pub struct DeviceArray {
    pub buf: Arc<DeviceBuffer>,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl DeviceArray {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// A writable view of the whole array.
    pub fn view_mut<T: crate::gpu::memory::DeviceElem>(
        &mut self,
    ) -> PyResult<crate::gpu::memory::DeviceSliceMut<'_, T>> {
        let buf = std::sync::Arc::get_mut(&mut self.buf).ok_or_else(|| {
            QuantError::InvalidState("a shared DeviceArray cannot be written".into())
        })?;
        Ok(buf.view_mut())
    }

    /// A new, uninitialised array on `gpu`.
    pub fn empty(gpu: &Arc<Gpu>, shape: Vec<usize>, dtype: DType) -> PyResult<DeviceArray> {
        let n: usize = shape.iter().product();
        Ok(DeviceArray {
            buf: Arc::new(DeviceBuffer::alloc(gpu, n * dtype.size())?),
            shape,
            dtype,
        })
    }

    pub(super) fn host_copy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let b = &self.buf;
        let shape = self.shape.clone();
        Ok(match self.dtype {
            DType::F32 => {
                let v: Vec<f32> = py.detach(|| b.to_host())?;
                numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any()
            }
            DType::F64 => {
                let v: Vec<f64> = py.detach(|| b.to_host())?;
                numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any()
            }
            DType::U8 => {
                let v: Vec<u8> = py.detach(|| b.to_host())?;
                numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any()
            }
            DType::I8 => {
                let v: Vec<i8> = py.detach(|| b.to_host())?;
                numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any()
            }
        })
    }
}

fn ordinal_of(device: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(i) = device.extract::<usize>() {
        return Ok(i);
    }
    match super::parse_device(device)? {
        crate::linear::Device::Cuda(i) => Ok(i),
        crate::linear::Device::Cpu => Err(invalid("device", "expected a CUDA device, got 'cpu'")),
    }
}

/// Copy a NumPy array of `dtype` to `gpu` (C-contiguous copy first if needed).
pub(super) fn upload(
    gpu: &Arc<Gpu>,
    a: &Bound<'_, PyAny>,
    dtype: DType,
    arg: &str,
) -> PyResult<DeviceArray> {
    let py = a.py();
    macro_rules! go {
        ($t:ty) => {{
            let r = crate::python::arrays::input::<$t>(a, arg)?;
            let shape = r.shape().to_vec();
            let s = r.as_slice().map_err(|e| invalid(arg, e))?;
            let buf = py.detach(|| DeviceBuffer::from_host(gpu, s))?;
            DeviceArray {
                buf: Arc::new(buf),
                shape,
                dtype,
            }
        }};
    }
    Ok(match dtype {
        DType::F32 => go!(f32),
        DType::F64 => go!(f64),
        DType::U8 => go!(u8),
        DType::I8 => go!(i8),
    })
}

#[pymethods]
impl DeviceArray {
    /// Copy a NumPy array (float32, float64, uint8 or int8) to `device` (an index,
    /// "cuda" or "cuda:N").
    #[staticmethod]
    #[pyo3(signature = (a, device = None))]
    fn from_numpy(
        py: Python<'_>,
        a: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let ordinal = device.map(ordinal_of).transpose()?.unwrap_or(0);
        let arr = numpy_module(py)?.call_method1("asarray", (a,))?;
        let name: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
        let dtype = DType::from_name(&name)
            .ok_or_else(|| wrong_dtype("a", "float32, float64, uint8 or int8", &name))?;
        let g = gpu(py, ordinal)?;
        upload(&g, &arr, dtype, "a")
    }

    /// A NumPy copy of the data.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.host_copy(py)
    }

    #[pyo3(signature = (dtype = None, copy = None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(false) {
            return Err(invalid(
                "copy",
                "a DeviceArray cannot be viewed from the host without a copy",
            ));
        }
        let a = self.host_copy(py)?;
        match dtype {
            Some(d) if !d.is_none() => a.call_method1("astype", (d,)),
            _ => Ok(a),
        }
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.shape.len()
    }

    #[getter]
    fn size(&self) -> usize {
        self.len()
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.bytes()
    }

    /// The NumPy dtype.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        numpy_module(py)?.call_method1("dtype", (self.dtype.name(),))
    }

    /// `"cuda:N"`.
    #[getter]
    fn device(&self) -> String {
        format!("cuda:{}", self.buf.gpu().ordinal)
    }

    /// The device address of the first element (for interop and tests).
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.buf.ptr()
    }

    /// DLPack export. The data is complete when any quantrs call returns,
    /// so no stream ordering is needed and `stream` is accepted as given.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        if let Some((t, id)) = dl_device {
            if t != DL_CUDA || id != self.buf.gpu().ordinal as i32 {
                return Err(QuantError::UnsupportedOperation(format!(
                    "__dlpack__(dl_device=({t}, {id})): this array is on cuda:{} and is exported only there",
                    self.buf.gpu().ordinal
                ))
                .into());
            }
        }
        if copy == Some(true) {
            return Err(QuantError::UnsupportedOperation("__dlpack__(copy=True)".into()).into());
        }
        dlpack::export(py, self.buf.clone(), &self.shape, self.dtype.dl())
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (DL_CUDA, self.buf.gpu().ordinal as i32)
    }

    fn __len__(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceArray(shape={:?}, dtype={}, device='cuda:{}')",
            self.shape,
            self.dtype.name(),
            self.buf.gpu().ordinal
        )
    }
}
