//! `grad_input(grad_output)`: the input gradient `grad_output @ W` of every
//! layer class and of `QuantizedWeight` (`matmul_transposed`), through the
//! formats' transposed kernels with the GIL released (docs/torch.md,
//! "Fine-tuning on quantized weights"). The weight itself is frozen.

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{PyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::base::host_only;
use super::{PyFp8Linear, PyInt4Linear, PyInt8Linear, PyUnquantLinear};
use crate::error::{QuantError, Result};
use crate::format::WeightFormat;
use crate::python::arrays::input;
use crate::python::errors::invalid;
use crate::python::int4::PyQuantizedWeight;

/// `f(g, rows)` for float32 `g` `[..., out_feat]`, as a `[..., in_feat]`
/// array; `f` runs without the GIL.
fn grad_of<'py>(
    g: &Bound<'py, PyAny>,
    [out_feat, in_feat]: [usize; 2],
    f: impl FnOnce(&[f32], usize) -> Result<Vec<f32>> + Send,
) -> PyResult<Bound<'py, PyAny>> {
    let py = g.py();
    let ga = input::<f32>(g, "grad_output")?;
    let shape = ga.shape().to_vec();
    if shape.last() != Some(&out_feat) {
        return Err(QuantError::dims(
            "grad_output",
            format!("[..., {out_feat}]"),
            format!("{shape:?}"),
        )
        .into());
    }
    let gs = ga.as_slice().map_err(|e| invalid("grad_output", e))?;
    let rows = gs.len() / out_feat;
    let dx = py.detach(|| f(gs, rows))?;
    let mut out_shape = shape;
    *out_shape.last_mut().expect("rank >= 1, checked above") = in_feat;
    let arr = ArrayD::from_shape_vec(IxDyn(&out_shape), dx).map_err(|e| invalid("dx", e))?;
    Ok(PyArrayDyn::from_owned_array(py, arr).into_any())
}

/// `grad_input` on a layer over a `WeightFormat` (`[out, in]` seen).
macro_rules! quant_linear_grad {
    ($class:ty, $format:ty) => {
        #[pymethods]
        impl $class {
            /// The input gradient `grad_output @ W` for float32
            /// `grad_output [..., out]`: `[..., in]`, computed without
            /// materializing the float32 weight.
            fn grad_input<'py>(
                &self,
                grad_output: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                if let Some(c) = &self.cuda {
                    return Err(host_only("grad_input", c.ordinal()));
                }
                let layer = &*self.inner;
                let shape = <$format>::shape(layer.quantized_weight());
                grad_of(grad_output, shape, |g, rows| layer.grad_input(g, rows))
            }
        }
    };
}

quant_linear_grad!(PyInt4Linear, crate::format::Int4);
quant_linear_grad!(PyInt8Linear, crate::format::Int8);
quant_linear_grad!(PyUnquantLinear, crate::format::Float32);

#[pymethods]
impl PyFp8Linear {
    /// The input gradient `grad_output @ (decode(weight) * weight_scale_inv)`
    /// for float32 `grad_output [..., out]`: `[..., in]` (2-D weights; with an
    /// activation scale, its rounding is passed straight through).
    fn grad_input<'py>(&self, grad_output: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(c) = &self.cuda {
            return Err(host_only("grad_input", c.ordinal()));
        }
        let layer = &*self.inner;
        let &[o, i] = layer.shape() else {
            return Err(QuantError::UnsupportedOperation(format!(
                "grad_input: expected a 2-D weight [out, in], got shape {:?}",
                layer.shape()
            ))
            .into());
        };
        grad_of(grad_output, [o, i], |g, rows| layer.grad_input(g, rows))
    }
}

#[pymethods]
impl PyQuantizedWeight {
    /// `g @ W.T` for float32 `g [..., out_feat]`: `[..., in_feat]` (the input
    /// gradient of `matmul`), decoding the packed weight on the fly.
    fn matmul_transposed<'py>(&self, g: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let w = &self.inner;
        grad_of(g, [w.out_feat(), w.in_feat()], |g, rows| {
            let mut dx = vec![0f32; rows * w.in_feat()];
            w.try_matmul_transposed(g, rows, &mut dx)?;
            Ok(dx)
        })
    }
}
