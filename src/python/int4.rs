//! `quantrs.QuantizedWeight`: packed INT4 weights (docs/int4.md).

use std::path::PathBuf;

use numpy::ndarray::{ArrayD, ArrayView1, Ix1, Ix2, IxDyn};
use numpy::{PyArray1, PyArray2, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::arrays::{check_shape, inplace, input};
use super::errors::invalid;
use super::fields::pymethods_with_getters;
use super::gpu::CudaWeight;
use super::nibble_group::contiguous;
use crate::error::QuantError;
use crate::int4::{Activations, QuantizedWeight as Core, ScaleMethod};
use crate::linear::Device;

/// Packed INT4 weight `[in_feat, out_feat]` with one f32 scale per group of
/// `group_size` input rows and output column.
///
/// Build it with `QuantizedWeight.quantize(w, group_size=32)` or from raw
/// buffers with `QuantizedWeight(data, scales, in_feat, out_feat, num_groups)`.
///
/// `.to("cuda")` gives a copy placed on a GPU: `matvec` / `matmul` run
/// there; every other method reads the host value it keeps.
#[pyclass(name = "QuantizedWeight", module = "quantrs", frozen, eq)]
pub struct PyQuantizedWeight {
    pub inner: Core,
    /// The device copy `matvec` / `matmul` run on (None: on the host).
    pub(crate) cuda: Option<CudaWeight>,
}

/// Equal values on the same device.
impl PartialEq for PyQuantizedWeight {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner && self.ordinal() == other.ordinal()
    }
}

impl PyQuantizedWeight {
    /// A weight on the host.
    pub(crate) fn host(inner: Core) -> Self {
        PyQuantizedWeight { inner, cuda: None }
    }

    fn ordinal(&self) -> Option<usize> {
        self.cuda.as_ref().map(CudaWeight::ordinal)
    }

    /// A read-only NumPy view of a buffer owned by this object.
    fn view<'py, T: numpy::Element>(
        slf: &Bound<'py, Self>,
        buf: &[T],
    ) -> PyResult<Bound<'py, PyArray1<T>>> {
        let view = ArrayView1::from(buf);
        // SAFETY: `buf` belongs to the frozen pyclass `slf`, which is never
        // mutated or reallocated after construction; the array's base keeps
        // `slf` alive for as long as the view exists.
        let arr = unsafe { PyArray1::borrow_from_array(&view, slf.clone().into_any()) };
        arr.readwrite().make_nonwriteable();
        Ok(arr)
    }

    /// `y = x @ W`: `x` `[in_feat]` (`vector`) or `[batch, in_feat]`. With
    /// float32 activations and no `out`, through the crate's `matvec_array`
    /// / `matmul_array` on a zero-copy view of `x` (the result moves into
    /// NumPy without a copy); otherwise the slice kernels write into `out`
    /// or a new array.
    fn run_matmul<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        vector: bool,
        activations: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let act = Activations::parse(activations)?;
        if let Some(c) = &self.cuda {
            if out.is_some() || act != Activations::Float32 {
                return Err(QuantError::UnsupportedOperation(format!(
                    "out= and activations='int8' on cuda:{} (move the weight with .to('cpu'))",
                    c.ordinal()
                ))
                .into());
            }
            return Ok(c.run(x, vector)?.into_bound(py));
        }
        let w = &self.inner;
        let xa = input::<f32>(x, "x")?;
        let expected = || {
            if vector {
                format!("[{}]", w.in_feat())
            } else {
                format!("[batch, {}]", w.in_feat())
            }
        };
        let wrong_x = || QuantError::dims("x", expected(), format!("{:?}", xa.shape()));
        if let (None, Activations::Float32) = (out, act) {
            let xv = xa.as_array();
            return Ok(if vector {
                let x1 = xv.into_dimensionality::<Ix1>().map_err(|_| wrong_x())?;
                if x1.len() != w.in_feat() {
                    return Err(wrong_x().into());
                }
                PyArray1::from_owned_array(py, py.detach(|| w.matvec_array(x1))?).into_any()
            } else {
                let x2 = xv.into_dimensionality::<Ix2>().map_err(|_| wrong_x())?;
                if x2.ncols() != w.in_feat() {
                    return Err(wrong_x().into());
                }
                PyArray2::from_owned_array(py, py.detach(|| w.matmul_array(x2))?).into_any()
            });
        }
        let (batch, out_shape) = match (vector, xa.shape()) {
            (true, [k]) if *k == w.in_feat() => (1, vec![w.out_feat()]),
            (false, [b, k]) if *k == w.in_feat() => (*b, vec![*b, w.out_feat()]),
            _ => return Err(wrong_x().into()),
        };
        let xs = contiguous(&xa, "x")?;
        let Some(out) = out else {
            let mut y = vec![0.0f32; batch * w.out_feat()];
            py.detach(|| w.view().matmul_act(xs, batch, &mut y, act))?;
            let arr =
                ArrayD::from_shape_vec(IxDyn(&out_shape), y).map_err(|e| invalid("out", e))?;
            return Ok(PyArrayDyn::from_owned_array(py, arr).into_any());
        };
        // `out=` is the caller's buffer: the slice kernel writes into it.
        let mut ya = inplace::<f32>(out, "out")?;
        check_shape("out", ya.shape(), &out_shape)?;
        let ys = ya.as_slice_mut().map_err(|e| invalid("out", e))?;
        py.detach(|| w.view().matmul_act(xs, batch, ys, act))?;
        Ok(out.clone())
    }
}

pymethods_with_getters!(PyQuantizedWeight, {}, {
    /// Input features (rows of the weight).
    #[getter]
    fn in_feat(&self) -> usize {
        self.inner.in_feat()
    }

    /// Output features (columns of the weight).
    #[getter]
    fn out_feat(&self) -> usize {
        self.inner.out_feat()
    }

    /// Scale groups along the input axis.
    #[getter]
    fn num_groups(&self) -> usize {
        self.inner.num_groups()
    }

    /// Rebuild from raw buffers, validating every size and value.
    #[new]
    fn new(
        data: &Bound<'_, PyAny>,
        scales: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::sizes::in_feat)] in_feat: usize,
        #[pyo3(from_py_with = crate::python::sizes::out_feat)] out_feat: usize,
        #[pyo3(from_py_with = crate::python::sizes::num_groups)] num_groups: usize,
    ) -> PyResult<Self> {
        let d = super::fp8::u8_input(data, "data")?;
        let s = input::<f32>(scales, "scales")?;
        // Flat, or 2-D with out_feat columns (what `.data` / `.scales`
        // return): a `(1, 1, n)` array of the right size is a mistake.
        for (arg, shape) in [("data", d.shape()), ("scales", s.shape())] {
            let ok = shape.len() == 1 || (shape.len() == 2 && shape[1] == out_feat);
            if !ok {
                return Err(QuantError::dims(
                    arg,
                    format!("a flat array or [_, {out_feat}]"),
                    format!("{shape:?}"),
                )
                .into());
            }
        }
        let inner = Core::from_parts(
            contiguous(&d, "data")?.to_vec(),
            contiguous(&s, "scales")?.to_vec(),
            in_feat,
            out_feat,
            num_groups,
        )?;
        Ok(PyQuantizedWeight::host(inner))
    }

    /// Quantize `w` (float32 `[in_feat, out_feat]`; or flat with `in_feat` and
    /// `out_feat` given: the flat form of the Rust `quantize`), one scale per group
    /// chosen by `method` ("search", the default: least weighted squared error, never
    /// worse than "rtn" under that error; "rtn": absmax / 7, the grid of files written
    /// before "search" became the default, bit-identical; "full": max / -8;
    /// docs/int4.md "Quantizers"), `importance` (float32 `[in_feat]`, >= 0: each
    /// input's mean x^2) weighting the error of "search".
    #[staticmethod]
    #[pyo3(signature = (w, in_feat = None, out_feat = None, *, group_size = 32, method = "search", importance = None))]
    #[allow(clippy::too_many_arguments)]
    fn quantize(
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::sizes::opt_in_feat)] in_feat: Option<usize>,
        #[pyo3(from_py_with = crate::python::sizes::opt_out_feat)] out_feat: Option<usize>,
        #[pyo3(from_py_with = crate::python::sizes::group_size)] group_size: usize,
        method: &str,
        importance: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let method = ScaleMethod::parse(method).ok_or_else(|| {
            invalid(
                "method",
                format!("expected 'rtn', 'full' or 'search', got {method:?}"),
            )
        })?;
        let imp = super::nibble_group::importance(importance, "[in_feat]")?;
        let imp = imp
            .as_ref()
            .map(|a| contiguous(a, "importance"))
            .transpose()?;
        let wa = input::<f32>(w, "w")?;
        let shape = wa.shape().to_vec();
        let (k, n) = match (in_feat, out_feat) {
            (None, None) => match shape[..] {
                [k, n] => (k, n),
                _ => {
                    return Err(QuantError::dims(
                        "w",
                        "a 2-D array [in_feat, out_feat] (or pass in_feat and out_feat)",
                        format!("shape {shape:?}"),
                    )
                    .into())
                }
            },
            (Some(k), Some(n)) => {
                // Flat (the Rust `quantize`'s form; its length is checked with the
                // sizes) or exactly [in_feat, out_feat].
                if shape.len() != 1 && shape[..] != [k, n] {
                    return Err(
                        QuantError::dims("w", format!("[{k}, {n}]"), format!("{shape:?}")).into(),
                    );
                }
                (k, n)
            }
            _ => {
                return Err(invalid(
                    "in_feat/out_feat",
                    "give both (with a flat w) or neither (with a 2-D w)",
                ))
            }
        };
        let ws = contiguous(&wa, "w")?;
        // Under `quantrs.threads` (the quantizer splits over rayon, which
        // the cap does not reach otherwise).
        let inner = py.detach(|| {
            crate::par::run_capped(|| Core::quantize_method(ws, k, n, group_size, method, imp))
        })?;
        Ok(PyQuantizedWeight::host(inner))
    }

    /// Packed nibbles, uint8 `[num_pairs * out_feat]` (read-only view).
    #[getter]
    fn data<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<u8>>> {
        Self::view(slf, slf.get().inner.data())
    }

    /// Scales, float32 `[num_groups * out_feat]` (read-only view).
    #[getter]
    fn scales<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        Self::view(slf, slf.get().inner.scales())
    }

    /// Effective group size (rows per scale).
    #[getter]
    fn group_size(&self) -> usize {
        self.inner.group_size()
    }

    /// Bytes of packed data plus scales.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// The weight as a new float32 array `[in_feat, out_feat]`.
    fn dequantize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let arr = PyArray2::<f32>::zeros(py, [self.inner.in_feat(), self.inner.out_feat()], false);
        {
            let mut rw = arr.readwrite();
            let s = rw.as_slice_mut().map_err(|e| invalid("out", e))?;
            py.detach(|| self.inner.try_dequantize_to(s))?;
        }
        Ok(arr)
    }

    /// Dequantize into `out`, a writable C-contiguous float32 `[in_feat, out_feat]`.
    fn dequantize_to(&self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut rw = inplace::<f32>(out, "out")?;
        check_shape(
            "out",
            rw.shape(),
            &[self.inner.in_feat(), self.inner.out_feat()],
        )?;
        let s = rw.as_slice_mut().map_err(|e| invalid("out", e))?;
        py.detach(|| self.inner.try_dequantize_to(s))?;
        Ok(())
    }

    /// `y = W^T x`: `x` `[in_feat]` -> `[out_feat]` (into `out` if given).
    /// `activations="int8"` quantizes `x` per group to int8 and runs integer
    /// dot products (docs/int4.md, "Int8 activations").
    #[pyo3(signature = (x, out = None, *, activations = "float32"))]
    fn matvec<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        activations: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run_matmul(py, x, out, true, activations)
    }

    /// `Y = X W`: `x` `[batch, in_feat]` -> `[batch, out_feat]` (into `out` if
    /// given). A blocked GEMM from batch 8 on; `activations` as in `matvec`.
    #[pyo3(signature = (x, out = None, *, activations = "float32"))]
    fn matmul<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        activations: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run_matmul(py, x, out, false, activations)
    }

    /// Save as safetensors (`data` U8, `scales` F32, shape metadata), atomically.
    fn save(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::scalars::path)] path: PathBuf,
    ) -> PyResult<()> {
        py.detach(|| self.inner.save(&path))?;
        Ok(())
    }

    /// Load a file written by `save`.
    #[staticmethod]
    fn load(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::scalars::path)] path: PathBuf,
    ) -> PyResult<Self> {
        let inner = py.detach(|| Core::load(&path))?;
        Ok(PyQuantizedWeight::host(inner))
    }

    /// The safetensors bytes `save` writes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.inner.to_safetensors_bytes()?;
        Ok(PyBytes::new(py, &b))
    }

    /// Parse bytes from `to_bytes`, validating them.
    #[staticmethod]
    fn from_bytes(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let inner =
            crate::python::scalars::with_bytes(data, "data", Core::from_safetensors_bytes)??;
        Ok(PyQuantizedWeight::host(inner))
    }

    /// This weight on `device` ("cpu", "cuda", "cuda:N"), as `Tensor.to`
    /// does: itself when it is there already, else a new `QuantizedWeight`
    /// whose `matvec` / `matmul` run there.
    fn to<'py>(slf: &Bound<'py, Self>, device: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let py = slf.py();
        let this = slf.get();
        let cuda = match super::gpu::parse_device(device)? {
            Device::Cpu if this.cuda.is_none() => return Ok(slf.clone()),
            Device::Cuda(i) if this.ordinal() == Some(i) => return Ok(slf.clone()),
            Device::Cpu => None,
            Device::Cuda(i) => Some(CudaWeight::from_cpu(py, &this.inner, i)?),
        };
        Bound::new(
            py,
            PyQuantizedWeight {
                inner: this.inner.clone(),
                cuda,
            },
        )
    }

    /// Where `matvec` / `matmul` run: `"cpu"` or `"cuda:N"`.
    #[getter]
    fn device(&self) -> String {
        super::gpu::placement_name(self.ordinal())
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let ctor = py.get_type::<Self>().getattr("from_bytes")?;
        let bytes = slf.get().to_bytes(py)?;
        PyTuple::new(py, [ctor, PyTuple::new(py, [bytes])?.into_any()])
    }

    fn __repr__(&self) -> String {
        let w = &self.inner;
        let device = match self.ordinal() {
            None => String::new(),
            Some(i) => format!(", device='cuda:{i}'"),
        };
        format!(
            "QuantizedWeight(in_feat={}, out_feat={}, num_groups={}, group_size={}, nbytes={}{device})",
            w.in_feat(),
            w.out_feat(),
            w.num_groups(),
            w.group_size(),
            w.nbytes()
        )
    }
});

/// The GPU placement of `obj` when it is a `QuantizedWeight` on a device.
#[cfg(feature = "gpu")]
pub(crate) fn cuda_weight<'a>(obj: &'a Bound<'_, PyAny>) -> Option<&'a CudaWeight> {
    obj.cast::<PyQuantizedWeight>().ok()?.get().cuda.as_ref()
}

/// Add `QuantizedWeight` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyQuantizedWeight>()
}
