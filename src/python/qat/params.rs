//! `QuantParams` and the free functions behind `quantrs.qat`
//! (`calibrate`, `fake_quant`, `fake_quant_backward`).

use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use rayon::prelude::*;

use super::convert::{float_input, on_float, one_off_rounding, to_array, FloatIn};
use super::enums::{int_dtype, rounding_arg, scheme_arg, target_arg};
use super::rng::seed_arg;
use crate::python::arrays::{check_shape, input};
use crate::python::errors::wrong_dtype;
use crate::python::fields::pymethods_with_getters;
use crate::qat::{
    calibrate, calibrate_per_channel, fake_quant_backward, fake_quant_fp8, fake_quant_int,
    fake_quant_per_channel, quantize_int, Master, QuantParams, QuantScheme, QuantTarget, Rounding,
};
use crate::QuantError;

/// Integer quantization parameters: `q = clamp(round(x / scale + zero_point),
/// qmin, qmax)`, `x ~ (q - zero_point) * scale`.
#[pyclass(module = "quantrs", name = "QuantParams", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyQuantParams {
    pub inner: QuantParams,
}

impl PyQuantParams {
    pub fn wrap(inner: QuantParams) -> Self {
        PyQuantParams { inner }
    }
}

fn fake_int<'py, T: Master + Element>(
    py: Python<'py>,
    x: PyReadonlyArrayDyn<'py, T>,
    p: &QuantParams,
    r: Rounding,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let xs = x.as_slice()?;
    let mut out = vec![T::ZERO; xs.len()];
    py.detach(|| fake_quant_int(xs, &mut out, p, r))?;
    to_array(py, out, x.shape())
}

fn codes<'py, T: Master + Element>(
    py: Python<'py>,
    x: PyReadonlyArrayDyn<'py, T>,
    p: &QuantParams,
    r: Rounding,
) -> PyResult<Bound<'py, PyAny>> {
    let xs = x.as_slice()?;
    if p.fits_i8() {
        let mut out = vec![0i8; xs.len()];
        py.detach(|| quantize_int(xs, &mut out, p, r))?;
        Ok(to_array(py, out, x.shape())?.into_any())
    } else {
        let mut out = vec![0i32; xs.len()];
        py.detach(|| quantize_int(xs, &mut out, p, r))?;
        Ok(to_array(py, out, x.shape())?.into_any())
    }
}

pymethods_with_getters!(PyQuantParams, {
    scale: f64 = "Step between adjacent codes.",
    zero_point: i32 = "The code of 0.0.",
    qmin: i32 = "Smallest code.",
    qmax: i32 = "Largest code.",
}, {
    /// Parameters from their values (validated: scale finite and > 0,
    /// `qmin <= zero_point <= qmax`).
    #[new]
    fn new(
        #[pyo3(from_py_with = crate::python::scalars::float::scale)] scale: f64,
        #[pyo3(from_py_with = crate::python::sizes::zero_point)] zero_point: i32,
        #[pyo3(from_py_with = crate::python::sizes::qmin)] qmin: i32,
        #[pyo3(from_py_with = crate::python::sizes::qmax)] qmax: i32,
    ) -> PyResult<Self> {
        Ok(Self::wrap(QuantParams::new(scale, zero_point, qmin, qmax)?))
    }

    /// Symmetric parameters for an absolute maximum: `scale = absmax / qmax`.
    #[staticmethod]
    #[pyo3(signature = (absmax, target = None))]
    fn from_absmax(
        #[pyo3(from_py_with = crate::python::scalars::float::absmax)] absmax: f64,
        target: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let d = target_or_int8(target, "from_absmax")?;
        Ok(Self::wrap(QuantParams::from_absmax(absmax, d)?))
    }

    /// Parameters for the range `[min, max]` (affine by default).
    #[staticmethod]
    #[pyo3(signature = (min, max, target = None, scheme = None))]
    fn from_minmax(
        #[pyo3(from_py_with = crate::python::scalars::float::min)] min: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::max)] max: f64,
        target: Option<&Bound<'_, PyAny>>,
        scheme: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let d = target_or_int8(target, "from_minmax")?;
        let s = match scheme {
            Some(s) => scheme_arg(s)?,
            None => QuantScheme::Affine,
        };
        Ok(Self::wrap(QuantParams::from_minmax(min, max, d, s)?))
    }

    /// Per-tensor calibration of `x` (percentile when `clip_fraction > 0`).
    #[staticmethod]
    #[pyo3(signature = (x, target = None, scheme = None, *, clip_fraction = 0.0))]
    fn calibrate(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        target: Option<&Bound<'_, PyAny>>,
        scheme: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::python::scalars::float::clip_fraction)] clip_fraction: f64,
    ) -> PyResult<Self> {
        let d = target_or_int8(target, "calibrate")?;
        let s = scheme
            .map(scheme_arg)
            .transpose()?
            .unwrap_or(QuantScheme::Symmetric);
        let p = on_float!(float_input(x, "x")?, |a| {
            let xs = a.as_slice()?;
            py.detach(|| calibrate(xs, d, s, clip_fraction))?
        });
        Ok(Self::wrap(p))
    }

    /// Smallest representable value, `(qmin - zero_point) * scale`.
    #[getter]
    fn lo(&self) -> f64 {
        (self.inner.qmin as f64 - self.inner.zero_point as f64) * self.inner.scale
    }
    /// Largest representable value, `(qmax - zero_point) * scale`.
    #[getter]
    fn hi(&self) -> f64 {
        (self.inner.qmax as f64 - self.inner.zero_point as f64) * self.inner.scale
    }

    /// Integer codes of `x` (int8 when `[qmin, qmax]` fits, else int32).
    #[pyo3(signature = (x, rounding = None, rng = None))]
    fn quantize<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        rounding: Option<&Bound<'py, PyAny>>,
        rng: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = one_off(rounding, rng)?;
        on_float!(float_input(x, "x")?, |a| codes(py, a, &self.inner, r))
    }

    /// `(q - zero_point) * scale` as float64; codes outside `[qmin, qmax]`
    /// are an error.
    fn dequantize<'py>(
        &self,
        py: Python<'py>,
        q: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
        if let Ok(u) = q.cast::<PyUntypedArray>() {
            if !matches!(u.dtype().kind(), b'i' | b'u') {
                return Err(wrong_dtype("q", "an integer dtype", u.dtype()));
            }
        }
        let qa = input::<i64>(q, "q")?;
        let qs = qa.as_slice()?;
        let p = self.inner;
        if let Some(i) = qs
            .iter()
            .position(|&c| c < p.qmin as i64 || c > p.qmax as i64)
        {
            return Err(QuantError::arg(format!(
                "q: code {} at index {i} is outside [{}, {}]",
                qs[i], p.qmin, p.qmax
            ))
            .into());
        }
        let zp = p.zero_point as f64;
        let out: Vec<f64> =
            py.detach(|| qs.par_iter().map(|&c| (c as f64 - zp) * p.scale).collect());
        to_array(py, out, qa.shape())
    }

    /// Quantize then dequantize; float32 in gives float32 out, else float64.
    #[pyo3(signature = (x, rounding = None, rng = None))]
    fn fake_quant<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        rounding: Option<&Bound<'py, PyAny>>,
        rng: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = one_off(rounding, rng)?;
        let x = float_input(x, "x")?;
        Ok(on_float!(x, |a| fake_int(py, a, &self.inner, r)?.into_any()))
    }

    fn __repr__(&self) -> String {
        let p = &self.inner;
        format!(
            "QuantParams(scale={:?}, zero_point={}, qmin={}, qmax={})",
            p.scale, p.zero_point, p.qmin, p.qmax
        )
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let p = slf.get().inner;
        let args = (p.scale, p.zero_point, p.qmin, p.qmax).into_pyobject(py)?;
        PyTuple::new(py, [slf.get_type().into_any(), args.into_any()])
    }
});

fn target_or_int8(target: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<crate::qat::IntDtype> {
    match target {
        None => Ok(crate::qat::IntDtype::Int8),
        Some(t) => int_dtype(target_arg(t)?, what),
    }
}

fn one_off(
    rounding: Option<&Bound<'_, PyAny>>,
    rng: Option<&Bound<'_, PyAny>>,
) -> PyResult<Rounding> {
    let mode = rounding
        .map(rounding_arg)
        .transpose()?
        .unwrap_or(crate::qat::RoundingMode::Nearest);
    Ok(one_off_rounding(mode, seed_arg(rng)?))
}

/// Per-channel parameters of a 2-D `x` (`axis` is the channel axis).
#[pyfunction]
#[pyo3(signature = (x, axis, target, scheme, clip_fraction))]
fn qat_calibrate_per_channel(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = crate::python::sizes::axis)] axis: usize,
    target: &Bound<'_, PyAny>,
    scheme: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = crate::python::scalars::float::clip_fraction)] clip_fraction: f64,
) -> PyResult<Vec<PyQuantParams>> {
    let d = int_dtype(target_arg(target)?, "per-channel calibration")?;
    let s = scheme_arg(scheme)?;
    let x = float_input(x, "x")?;
    let shape = shape2(&x)?;
    let ps = on_float!(&x, |a| {
        let xs = a.as_slice()?;
        py.detach(|| calibrate_per_channel(xs, shape, axis, d, s, clip_fraction))?
    });
    Ok(ps.into_iter().map(PyQuantParams::wrap).collect())
}

fn shape2(x: &FloatIn<'_>) -> PyResult<[usize; 2]> {
    let shape = on_float!(x, |a| a.shape().to_vec());
    match shape[..] {
        [r, c] => Ok([r, c]),
        _ => {
            Err(QuantError::dims("x (per-channel needs a 2-D tensor): ndim", 2, shape.len()).into())
        }
    }
}

fn fake_generic<'py, T: Master + Element>(
    py: Python<'py>,
    x: PyReadonlyArrayDyn<'py, T>,
    target: QuantTarget,
    s: QuantScheme,
    r: Rounding,
    clip: f64,
    axis: Option<usize>,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let xs = x.as_slice()?;
    let shape = x.shape().to_vec();
    let mut out = vec![T::ZERO; xs.len()];
    match (target, axis) {
        (QuantTarget::Fp8(f), None) => {
            if clip != 0.0 {
                return Err(QuantError::arg(
                    "clip_fraction: FP8 targets are a plain cast, nothing is calibrated",
                )
                .into());
            }
            py.detach(|| fake_quant_fp8(xs, &mut out, f, r))?;
        }
        (QuantTarget::Fp8(_), Some(_)) => {
            return Err(QuantError::arg(
                "axis: FP8 targets are a plain cast, they have no channels",
            )
            .into())
        }
        (QuantTarget::Int(d), None) => py.detach(|| {
            let p = calibrate(xs, d, s, clip)?;
            fake_quant_int(xs, &mut out, &p, r)
        })?,
        (QuantTarget::Int(d), Some(axis)) => {
            let [rows, cols] = match shape[..] {
                [a, b] => [a, b],
                _ => {
                    return Err(QuantError::dims(
                        "x (per-channel needs a 2-D tensor): ndim",
                        2,
                        shape.len(),
                    )
                    .into())
                }
            };
            py.detach(|| {
                let ps = calibrate_per_channel(xs, [rows, cols], axis, d, s, clip)?;
                fake_quant_per_channel(xs, [rows, cols], axis, &ps, r, &mut out)
            })?
        }
    }
    to_array(py, out, &shape)
}

/// Calibrate (per tensor or per channel) and fake-quantize.
#[pyfunction]
#[pyo3(signature = (x, target, scheme, rounding, rng, clip_fraction, axis))]
#[allow(clippy::too_many_arguments)]
fn qat_fake_quant<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    target: &Bound<'py, PyAny>,
    scheme: &Bound<'py, PyAny>,
    rounding: &Bound<'py, PyAny>,
    rng: Option<&Bound<'py, PyAny>>,
    #[pyo3(from_py_with = crate::python::scalars::float::clip_fraction)] clip_fraction: f64,
    #[pyo3(from_py_with = crate::python::sizes::opt_axis)] axis: Option<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let t = target_arg(target)?;
    let s = scheme_arg(scheme)?;
    let r = one_off(Some(rounding), rng)?;
    Ok(on_float!(float_input(x, "x")?, |a| {
        fake_generic(py, a, t, s, r, clip_fraction, axis)?.into_any()
    }))
}

fn ste<'py, T: Master + Element>(
    py: Python<'py>,
    g: PyReadonlyArrayDyn<'py, T>,
    x: PyReadonlyArrayDyn<'py, T>,
    lo: f64,
    hi: f64,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    check_shape("x", x.shape(), g.shape())?;
    let (gs, xs) = (g.as_slice()?, x.as_slice()?);
    let mut out = vec![T::ZERO; gs.len()];
    py.detach(|| fake_quant_backward(gs, xs, lo, hi, &mut out))?;
    to_array(py, out, g.shape())
}

/// Straight-through estimator: `grad` where `lo <= x <= hi`, else 0.
/// float32 out when `grad` and `x` are float32, else float64.
#[pyfunction]
fn qat_fake_quant_backward<'py>(
    py: Python<'py>,
    grad: &Bound<'py, PyAny>,
    x: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::python::scalars::float::lo)] lo: f64,
    #[pyo3(from_py_with = crate::python::scalars::float::hi)] hi: f64,
) -> PyResult<Bound<'py, PyAny>> {
    // float32 only when both are float32; otherwise both as float64, so
    // that `x` is never rounded before the range test.
    Ok(match (float_input(grad, "grad")?, float_input(x, "x")?) {
        (FloatIn::F32(g), FloatIn::F32(x)) => ste(py, g, x, lo, hi)?.into_any(),
        _ => ste(
            py,
            input::<f64>(grad, "grad")?,
            input::<f64>(x, "x")?,
            lo,
            hi,
        )?
        .into_any(),
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyQuantParams>()?;
    m.add_function(wrap_pyfunction!(qat_calibrate_per_channel, m)?)?;
    m.add_function(wrap_pyfunction!(qat_fake_quant, m)?)?;
    m.add_function(wrap_pyfunction!(qat_fake_quant_backward, m)?)?;
    Ok(())
}
