//! `int4_linear`, `int8_linear`, `fp8_linear`: the forwards of the torch
//! layers over packed weights they do not own. They read the caller's NumPy
//! arrays in place (torch's `Int4Linear` passes views of its `qweight` /
//! `scales` / `bias` buffers, made once; `Int8Linear` and `FP8Linear` theirs), so
//! the module holds its packed bytes once and an in-place write
//! (`load_state_dict`, `copy_`) is seen by the next call. The checks are
//! O(1): dtypes, contiguity and the sizes of the layout.
//!
//! Soundness: there is no `unsafe` here. A call borrows the arrays through
//! rust-numpy (`try_readonly`, which refuses an array a Rust writer holds)
//! for the length of the kernel only, with the GIL released. What
//! rust-numpy cannot see is a write by torch itself from another thread
//! during that call: the rule (docs/torch.md, "What runs zero-copy") is the
//! one every torch op that reads a tensor has, no writes to a module's
//! buffers while a forward of that module runs.

use numpy::{PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::errors::{invalid, wrong_dtype, wrong_type};
use super::nibble_group::last_axis_matmul;
use crate::error::QuantError;
use crate::int4::{Activations, QuantizedWeightRef};
use crate::linear::borrowed::{fp8_forward, int8_forward};

/// `arg` as the exact NumPy array the kernel will read: dtype `T`,
/// C-contiguous, `len` elements where given (a converted copy would not
/// share memory with the caller's buffer, so none is made).
pub(super) fn shared<'py, T: numpy::Element>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    len: Option<usize>,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    // Spelled out only for an error: a dtype's `str` runs Python code.
    let expected = || numpy::dtype::<T>(obj.py()).to_string();
    let Ok(u) = obj.cast::<numpy::PyUntypedArray>() else {
        return Err(wrong_type(
            arg,
            &format!("a numpy.ndarray of dtype {}", expected()),
            obj,
        ));
    };
    let Ok(a) = obj.cast::<PyArrayDyn<T>>() else {
        return Err(wrong_dtype(arg, &expected(), u.dtype().to_string()));
    };
    if !a.is_c_contiguous() {
        return Err(invalid(arg, "expected a C-contiguous array"));
    }
    match len {
        Some(n) if a.len() != n => {
            Err(QuantError::dims(arg, format!("{n} elements"), a.len()).into())
        }
        _ => Ok(a.clone()),
    }
}

/// `y = x @ W + bias` for float32 `x [..., in_feat]` -> `[..., out_feat]`
/// over a packed INT4 weight `[in_feat, out_feat]` read in place from the
/// caller's arrays: `data` uint8 (the packed nibbles), `scales` float32,
/// `bias` float32 `[out_feat]` or None (docs/int4.md), all C-contiguous and
/// of exactly that dtype (a converted copy would not be the caller's
/// buffer); `activations` "float32" or "int8" (docs/int4.md, "Int8
/// activations").
#[pyfunction]
#[pyo3(
    signature = (x, data, scales, bias, in_feat, out_feat, num_groups, *, activations = "float32".to_owned()),
    text_signature = "(x, data, scales, bias, in_feat, out_feat, num_groups, *, activations='float32')"
)]
#[allow(clippy::too_many_arguments)]
pub fn int4_linear<'py>(
    x: &Bound<'py, PyAny>,
    data: &Bound<'py, PyAny>,
    scales: &Bound<'py, PyAny>,
    bias: Option<&Bound<'py, PyAny>>,
    #[pyo3(from_py_with = crate::python::sizes::in_feat)] in_feat: usize,
    #[pyo3(from_py_with = crate::python::sizes::out_feat)] out_feat: usize,
    #[pyo3(from_py_with = crate::python::sizes::num_groups)] num_groups: usize,
    #[pyo3(from_py_with = crate::python::scalars::text::activations)] activations: String,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let act = Activations::parse(&activations)?;
    let arrays = Int4Arrays::new(data, scales, bias, out_feat)?;
    let views = arrays.read()?;
    let (w, bias) = views.weight(in_feat, out_feat, num_groups)?;
    last_axis_matmul(x, out_feat, in_feat, |xs, rows, y| {
        w.matmul_act(xs, rows, y, act)?;
        if let Some(b) = bias {
            for row in y.chunks_exact_mut(out_feat) {
                row.iter_mut().zip(b).for_each(|(v, bi)| *v += bi);
            }
        }
        Ok(())
    })
}

/// `y = x @ W + bias` for bfloat16 `x` `[..., in_feat]`, given as its bits
/// (a uint16 array: NumPy has no bfloat16; torch's `x.view(torch.uint16)`),
/// into bfloat16 bits `[..., out_feat]`: the weight arguments of
/// [`int4_linear`], the float32 bias added before the one rounding of each
/// output. Prefill-sized batches run the bf16 tile GEMM on `x` as it is
/// (docs/int4.md, "How matmul works").
#[pyfunction]
#[pyo3(signature = (x, data, scales, bias, in_feat, out_feat, num_groups))]
#[allow(clippy::too_many_arguments)]
pub fn int4_linear_bf16<'py>(
    x: &Bound<'py, PyAny>,
    data: &Bound<'py, PyAny>,
    scales: &Bound<'py, PyAny>,
    bias: Option<&Bound<'py, PyAny>>,
    #[pyo3(from_py_with = crate::python::sizes::in_feat)] in_feat: usize,
    #[pyo3(from_py_with = crate::python::sizes::out_feat)] out_feat: usize,
    #[pyo3(from_py_with = crate::python::sizes::num_groups)] num_groups: usize,
) -> PyResult<Bound<'py, PyArrayDyn<u16>>> {
    let py = x.py();
    let xa = shared::<u16>(x, "x", None)?;
    let arrays = Int4Arrays::new(data, scales, bias, out_feat)?;
    let shape = xa.shape().to_vec();
    if shape.last() != Some(&in_feat) {
        return Err(
            QuantError::dims("x", format!("[..., {in_feat}]"), format!("{shape:?}")).into(),
        );
    }
    let rows = shape[..shape.len() - 1].iter().product::<usize>();
    let xv = xa.try_readonly()?;
    let views = arrays.read()?;
    let (w, bias) = views.weight(in_feat, out_feat, num_groups)?;
    let xs = xv.as_slice().map_err(|e| invalid("x", e))?;
    let mut y = vec![0u16; rows * out_feat];
    py.detach(|| w.matmul_bf16(xs, rows, bias, &mut y))?;
    let mut out_shape = shape;
    *out_shape.last_mut().unwrap_or(&mut 0) = out_feat;
    let arr = numpy::ndarray::ArrayD::from_shape_vec(out_shape, y).map_err(|e| invalid("x", e))?;
    Ok(PyArrayDyn::from_owned_array(py, arr))
}

/// The optional float32 `bias` `[out_feat]` as a `shared` array.
pub(super) fn shared_bias<'py>(
    bias: Option<&Bound<'py, PyAny>>,
    out_feat: usize,
) -> PyResult<Option<Bound<'py, PyArrayDyn<f32>>>> {
    bias.map(|b| shared::<f32>(b, "bias", Some(out_feat)))
        .transpose()
}

/// A read borrow of an optional `shared` array, held for the kernel.
pub(super) fn read_opt<'py>(
    a: &Option<Bound<'py, PyArrayDyn<f32>>>,
) -> PyResult<Option<PyReadonlyArrayDyn<'py, f32>>> {
    Ok(a.as_ref().map(|a| a.try_readonly()).transpose()?)
}

/// The caller's arrays of a packed INT4 weight (`int4_linear` and
/// `int4_linear_bf16`): `data` uint8, `scales` float32 and the optional
/// `bias`, each checked by `shared`.
struct Int4Arrays<'py> {
    data: Bound<'py, PyArrayDyn<u8>>,
    scales: Bound<'py, PyArrayDyn<f32>>,
    bias: Option<Bound<'py, PyArrayDyn<f32>>>,
}

/// [`Int4Arrays`] borrowed for reading, for the length of one kernel.
struct Int4Views<'py> {
    data: PyReadonlyArrayDyn<'py, u8>,
    scales: PyReadonlyArrayDyn<'py, f32>,
    bias: Option<PyReadonlyArrayDyn<'py, f32>>,
}

impl<'py> Int4Arrays<'py> {
    fn new(
        data: &Bound<'py, PyAny>,
        scales: &Bound<'py, PyAny>,
        bias: Option<&Bound<'py, PyAny>>,
        out_feat: usize,
    ) -> PyResult<Self> {
        Ok(Int4Arrays {
            data: shared::<u8>(data, "data", None)?,
            scales: shared::<f32>(scales, "scales", None)?,
            bias: shared_bias(bias, out_feat)?,
        })
    }

    fn read(&self) -> PyResult<Int4Views<'py>> {
        let (data, scales) = (self.data.try_readonly()?, self.scales.try_readonly()?);
        let bias = read_opt(&self.bias)?;
        Ok(Int4Views { data, scales, bias })
    }
}

impl Int4Views<'_> {
    /// The weight over the borrowed buffers (its layout checked) and the
    /// bias slice.
    fn weight(
        &self,
        in_feat: usize,
        out_feat: usize,
        num_groups: usize,
    ) -> PyResult<(QuantizedWeightRef<'_>, Option<&[f32]>)> {
        let w = QuantizedWeightRef::new(
            self.data.as_slice().map_err(|e| invalid("data", e))?,
            self.scales.as_slice().map_err(|e| invalid("scales", e))?,
            in_feat,
            out_feat,
            num_groups,
        )?;
        Ok((w, opt_slice(&self.bias, "bias")?))
    }
}

/// The slice of an optional borrowed array.
pub(super) fn opt_slice<'a>(
    a: &'a Option<numpy::PyReadonlyArrayDyn<'_, f32>>,
    arg: &str,
) -> PyResult<Option<&'a [f32]>> {
    a.as_ref()
        .map(|a| a.as_slice().map_err(|e| invalid(arg, e)))
        .transpose()
}

/// A 2-D `[out, in]` code array's shape, or an error naming `arg`.
fn matrix_shape<T: numpy::Element>(
    a: &Bound<'_, PyArrayDyn<T>>,
    arg: &str,
) -> PyResult<[usize; 2]> {
    match a.shape() {
        [o, i] => Ok([*o, *i]),
        other => Err(QuantError::dims(arg, "a 2-D array [out, in]", format!("{other:?}")).into()),
    }
}

/// One float32 value of a one-element array (a 0-d tensor's view), read at
/// each call so that an in-place write to it is seen.
fn scalar(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<f32> {
    let a = shared::<f32>(obj, arg, Some(1))?;
    let v = a.try_readonly()?;
    Ok(v.as_slice().map_err(|e| invalid(arg, e))?[0])
}

/// `x @ W.T + bias` for float32 `x [..., in]` over int8 codes `weight`
/// `[out, in]` (int8) and one float32 scale per output (`scales` `[out]`),
/// read in place from the caller's arrays (`quantrs.Int8Linear`'s forward).
#[pyfunction]
#[pyo3(signature = (x, weight, scales, bias))]
pub fn int8_linear<'py>(
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    scales: &Bound<'py, PyAny>,
    bias: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let w = shared::<i8>(weight, "weight", None)?;
    let shape = matrix_shape(&w, "weight")?;
    let s = shared::<f32>(scales, "scales", Some(shape[0]))?;
    let b = shared_bias(bias, shape[0])?;
    let (wv, sv) = (w.try_readonly()?, s.try_readonly()?);
    let bv = read_opt(&b)?;
    let (q, sc) = (
        wv.as_slice().map_err(|e| invalid("weight", e))?,
        sv.as_slice().map_err(|e| invalid("scales", e))?,
    );
    let bias = opt_slice(&bv, "bias")?;
    last_axis_matmul(x, shape[0], shape[1], |xs, _, y| {
        int8_forward(q, sc, shape, bias, xs, y)
    })
}

/// `x @ W.T + bias` for float32 `x [..., in]` over E4M3 codes `weight`
/// `[out, in]` (uint8) times `weight_scale_inv` (a one-element float32 array),
/// W8A8 where `activation_scale` (the same) is given: `quantrs.PerTensorFP8Linear`'s
/// forward over the caller's arrays, read in place.
#[pyfunction]
#[pyo3(signature = (x, weight, weight_scale_inv, activation_scale, bias))]
pub fn fp8_linear<'py>(
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    weight_scale_inv: &Bound<'py, PyAny>,
    activation_scale: Option<&Bound<'py, PyAny>>,
    bias: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let w = shared::<u8>(weight, "weight", None)?;
    let shape = matrix_shape(&w, "weight")?;
    let wsi = scalar(weight_scale_inv, "weight_scale_inv")?;
    let act = activation_scale
        .map(|a| scalar(a, "activation_scale"))
        .transpose()?;
    let b = shared_bias(bias, shape[0])?;
    let wv = w.try_readonly()?;
    let bv = read_opt(&b)?;
    let codes = wv.as_slice().map_err(|e| invalid("weight", e))?;
    let bias = opt_slice(&bv, "bias")?;
    last_axis_matmul(x, shape[0], shape[1], |xs, _, y| {
        fp8_forward(codes, shape, wsi, act, bias, xs, y)
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(pyo3::wrap_pyfunction!(int4_linear, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(int4_linear_bf16, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(int8_linear, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(fp8_linear, m)?)
}
