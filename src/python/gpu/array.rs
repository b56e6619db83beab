// Over 400 lines: the DeviceArray class and every input conversion it shares
// (NumPy, DeviceArray, DLPack) in one place; splitting them is a follow-up.
//! `quantrs.cuda.DeviceArray` and the conversion of call inputs: NumPy
//! (copied to the device), `DeviceArray`, or a CUDA DLPack producer (read
//! in place).

use std::sync::Arc;

use numpy::{PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::dlpack::{self, DLDataType, DL_CUDA, DL_FLOAT, DL_INT, DL_UINT};
use crate::error::QuantError;
use crate::gpu::context::{self, Gpu};
use crate::gpu::memory::{to_host, DeviceBuffer};
use crate::python::arrays::numpy_module;
use crate::python::errors::{invalid, wrong_dtype};

/// Element types a `DeviceArray` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    U8,
    I8,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::U8 => "uint8",
            DType::I8 => "int8",
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::U8 | DType::I8 => 1,
        }
    }

    pub fn dl(self) -> DLDataType {
        let (code, bits) = match self {
            DType::F32 => (DL_FLOAT, 32),
            DType::U8 => (DL_UINT, 8),
            DType::I8 => (DL_INT, 8),
        };
        DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }

    fn from_dl(t: DLDataType) -> Option<DType> {
        [DType::F32, DType::U8, DType::I8]
            .into_iter()
            .find(|d| d.dl() == t)
    }

    fn from_name(name: &str) -> Option<DType> {
        match name {
            "float32" => Some(DType::F32),
            "uint8" => Some(DType::U8),
            "int8" => Some(DType::I8),
            _ => None,
        }
    }
}

fn describe_dl(t: DLDataType) -> String {
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

/// Find NVRTC next to the interpreter once (PyPI's `nvidia-cuda-nvrtc`
/// wheel: `nvidia/cu13/lib`, or `nvidia/cuda_nvrtc/lib` of the CUDA 12
/// wheels) unless `QUANTRS_NVRTC` is already set.
fn point_at_nvrtc(py: Python<'_>) {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        if std::env::var_os("QUANTRS_NVRTC").is_some_and(|p| !p.is_empty()) {
            return;
        }
        let found = (|| -> PyResult<Option<String>> {
            let Ok(nvidia) = py.import("nvidia") else {
                return Ok(None);
            };
            // A namespace package's _NamespacePath: list() it.
            let path = nvidia.getattr("__path__")?;
            let paths: Vec<String> = py
                .import("builtins")?
                .getattr("list")?
                .call1((path,))?
                .extract()?;
            for p in paths {
                for sub in ["cu13/lib", "cuda_nvrtc/lib"] {
                    let dir = std::path::Path::new(&p).join(sub);
                    let has = std::fs::read_dir(&dir).is_ok_and(|mut d| {
                        d.any(|e| {
                            e.is_ok_and(|e| {
                                e.file_name().to_string_lossy().starts_with("libnvrtc.so")
                            })
                        })
                    });
                    if has {
                        return Ok(Some(dir.to_string_lossy().into_owned()));
                    }
                }
            }
            Ok(None)
        })();
        if let Ok(Some(dir)) = found {
            // Through os.environ, so Python sees it too.
            let _ = py
                .import("os")
                .and_then(|os| os.getattr("environ")?.set_item("QUANTRS_NVRTC", dir));
        }
    });
}

/// The device `ordinal`, opened on first use.
pub fn gpu(py: Python<'_>, ordinal: usize) -> PyResult<Arc<Gpu>> {
    point_at_nvrtc(py);
    Ok(context::device(ordinal)?)
}

/// A C-contiguous array in device memory (float32, uint8 or int8).
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

    /// A new, uninitialised array on `gpu`.
    pub fn empty(gpu: &Arc<Gpu>, shape: Vec<usize>, dtype: DType) -> PyResult<DeviceArray> {
        let n: usize = shape.iter().product();
        Ok(DeviceArray {
            buf: Arc::new(DeviceBuffer::alloc(gpu, n * dtype.size())?),
            shape,
            dtype,
        })
    }

    fn host_copy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let g = &self.buf.gpu;
        let (p, n) = (self.buf.ptr(), self.len());
        let shape = self.shape.clone();
        Ok(match self.dtype {
            DType::F32 => {
                let v: Vec<f32> = py.detach(|| to_host(g, p, n))?;
                numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any()
            }
            DType::U8 => {
                let v: Vec<u8> = py.detach(|| to_host(g, p, n))?;
                numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any()
            }
            DType::I8 => {
                let v: Vec<i8> = py.detach(|| to_host(g, p, n))?;
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
fn upload(gpu: &Arc<Gpu>, a: &Bound<'_, PyAny>, dtype: DType, arg: &str) -> PyResult<DeviceArray> {
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
        DType::U8 => go!(u8),
        DType::I8 => go!(i8),
    })
}

#[pymethods]
impl DeviceArray {
    /// Copy a NumPy array (float32, uint8 or int8) to `device` (an index,
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
            .ok_or_else(|| wrong_dtype("a", "float32, uint8 or int8", &name))?;
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
        format!("cuda:{}", self.buf.gpu.ordinal)
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
            if t != DL_CUDA || id != self.buf.gpu.ordinal as i32 {
                return Err(QuantError::UnsupportedOperation(format!(
                    "__dlpack__(dl_device=({t}, {id})): this array is on cuda:{} and is exported only there",
                    self.buf.gpu.ordinal
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
        (DL_CUDA, self.buf.gpu.ordinal as i32)
    }

    fn __len__(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceArray(shape={:?}, dtype={}, device='cuda:{}')",
            self.shape,
            self.dtype.name(),
            self.buf.gpu.ordinal
        )
    }
}

/// A call input on the device: its address, shape, and what keeps it alive.
pub struct DevInput<'py> {
    pub ptr: u64,
    pub shape: Vec<usize>,
    /// Whether it came from the host (then the result goes back as NumPy).
    pub from_host: bool,
    _keep: Keep<'py>,
}

enum Keep<'py> {
    Array(#[allow(dead_code)] Bound<'py, DeviceArray>),
    Uploaded(#[allow(dead_code)] DeviceArray),
    Imported(#[allow(dead_code)] dlpack::Imported<'py>),
}

fn cuda_dlpack_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    if !obj.hasattr("__dlpack_device__")? || !obj.hasattr("__dlpack__")? {
        return Ok(None);
    }
    let (t, id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    Ok(Some((t, id)))
}

/// `obj` as a device input of `dtype` for a call on `gpu`: a `DeviceArray`
/// or CUDA DLPack tensor (must be on `gpu`, C-contiguous, of `dtype`), or
/// a host array (copied in).
pub fn device_input<'py>(
    gpu: &Arc<Gpu>,
    obj: &Bound<'py, PyAny>,
    arg: &str,
    dtype: DType,
    what: &str,
) -> PyResult<DevInput<'py>> {
    let mismatch = |on: String| {
        QuantError::arg(format!(
            "{arg} is on {on} but {what} is on cuda:{}: move one of them (.to(...))",
            gpu.ordinal
        ))
    };
    if let Ok(a) = obj.cast::<DeviceArray>() {
        let d = a.get();
        if d.dtype != dtype {
            return Err(wrong_dtype(arg, dtype.name(), d.dtype.name()));
        }
        if d.buf.gpu.ordinal != gpu.ordinal {
            return Err(mismatch(format!("cuda:{}", d.buf.gpu.ordinal)).into());
        }
        return Ok(DevInput {
            ptr: d.buf.ptr(),
            shape: d.shape.clone(),
            from_host: false,
            _keep: Keep::Array(a.clone()),
        });
    }
    if let Some((t, id)) = cuda_dlpack_device(obj)? {
        if t == DL_CUDA {
            if id as usize != gpu.ordinal {
                return Err(mismatch(format!("cuda:{id}")).into());
            }
            // stream=1: the legacy default stream, where quantrs runs; the
            // producer orders its pending work before it.
            let kwargs = PyDict::new(obj.py());
            kwargs.set_item("stream", 1)?;
            let cap = obj.call_method("__dlpack__", (), Some(&kwargs))?;
            let imp = dlpack::import(cap)?;
            if imp.device_id != gpu.ordinal as i32 {
                return Err(mismatch(format!("DLPack device {}", imp.device_id)).into());
            }
            match DType::from_dl(imp.dtype) {
                Some(d) if d == dtype => {}
                _ => return Err(wrong_dtype(arg, dtype.name(), describe_dl(imp.dtype))),
            }
            if !imp.contiguous {
                return Err(invalid(arg, format!("expected a C-contiguous tensor, got strides that are not (shape {:?}); call .contiguous() first", imp.shape)));
            }
            return Ok(DevInput {
                ptr: imp.ptr,
                shape: imp.shape.clone(),
                from_host: false,
                _keep: Keep::Imported(imp),
            });
        }
        if t != dlpack::DL_CPU {
            return Err(mismatch(format!("DLPack device type {t}")).into());
        }
    }
    let up = upload(gpu, obj, dtype, arg)?;
    Ok(DevInput {
        ptr: up.buf.ptr(),
        shape: up.shape.clone(),
        from_host: true,
        _keep: Keep::Uploaded(up),
    })
}

/// A result: NumPy when the input came from the host, else the array.
pub fn output(py: Python<'_>, out: DeviceArray, to_host: bool) -> PyResult<Py<PyAny>> {
    if to_host {
        Ok(out.host_copy(py)?.unbind())
    } else {
        Ok(Py::new(py, out)?.into_any())
    }
}

/// Whether `obj` is a CUDA array (DeviceArray or a CUDA DLPack producer).
pub fn is_cuda_array(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    if obj.cast::<DeviceArray>().is_ok() {
        return Ok(true);
    }
    Ok(matches!(cuda_dlpack_device(obj)?, Some((DL_CUDA, _))))
}

/// The device ordinal of a CUDA array input.
pub fn cuda_ordinal(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(a) = obj.cast::<DeviceArray>() {
        return Ok(a.get().buf.gpu.ordinal);
    }
    match cuda_dlpack_device(obj)? {
        Some((DL_CUDA, id)) => Ok(id.max(0) as usize),
        _ => Err(invalid("x", "expected a CUDA array")),
    }
}
