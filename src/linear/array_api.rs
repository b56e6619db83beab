//! The tensor-in, tensor-out `QuantMethod` methods on ndarray
//! (docs/rust.md): shapes and standard layout checked here, then the slice
//! methods (`forward_slice`, ...) do the work.

use std::sync::Arc;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use super::QuantMethod;
use crate::error::{QuantError, Result};

fn contiguous<'a, T>(a: &'a ArrayViewD<'_, T>, what: &str) -> Result<&'a [T]> {
    a.as_slice().ok_or_else(|| {
        QuantError::InvalidArgument(format!(
            "{what}: expected a standard-layout (C contiguous) array, got strides {:?}",
            a.strides()
        ))
    })
}

fn from_shape(shape: Vec<usize>, data: Vec<f32>) -> Result<ArrayD<f32>> {
    ArrayD::from_shape_vec(IxDyn(&shape), data)
        .map_err(|e| QuantError::InvalidState(format!("output shape {shape:?}: {e}")))
}

/// `forward` / `forward_autocast`: `x [..., in]` -> `[..., out]`.
pub(crate) fn forward<L: QuantMethod + ?Sized>(
    layer: &L,
    x: ArrayViewD<'_, f32>,
    autocast: bool,
) -> Result<ArrayD<f32>> {
    let (inf, outf) = (layer.in_features(), layer.out_features());
    if x.ndim() == 0 || x.shape()[x.ndim() - 1] != inf {
        return Err(QuantError::dims(
            "x shape",
            format!("[..., {inf}]"),
            format!("{:?}", x.shape()),
        ));
    }
    let xs = contiguous(&x, "x")?;
    let mut y = vec![0.0f32; xs.len() / inf.max(1) * outf];
    if autocast {
        layer.forward_autocast_slice(xs, &mut y)?;
    } else {
        layer.forward_slice(xs, &mut y)?;
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("ndim >= 1") = outf;
    from_shape(shape, y)
}

/// `gather_forward` / `gather_forward_autocast`: `x [tokens, in]`,
/// `indices [tokens, k]` -> `[tokens, k, out]`.
pub(crate) fn gather_forward<L: QuantMethod + ?Sized>(
    layer: &L,
    x: ArrayViewD<'_, f32>,
    indices: ArrayViewD<'_, i64>,
    autocast: bool,
) -> Result<ArrayD<f32>> {
    if indices.ndim() != 2 || x.ndim() != 2 || x.shape()[0] != indices.shape()[0] {
        return Err(QuantError::dims(
            "x, indices shapes",
            "[tokens, in] and [tokens, k]",
            format!("{:?} and {:?}", x.shape(), indices.shape()),
        ));
    }
    let (tokens, k) = (indices.shape()[0], indices.shape()[1]);
    let outf = layer.out_features();
    let xs = contiguous(&x, "x")?;
    let is = contiguous(&indices, "indices")?;
    let mut y = vec![0.0f32; tokens * k * outf];
    if autocast {
        layer.gather_forward_autocast_slice(xs, is, k, &mut y)?;
    } else {
        layer.gather_forward_slice(xs, is, k, &mut y)?;
    }
    from_shape(vec![tokens, k, outf], y)
}

/// `dequantize_w`: the weight in its logical shape.
pub(crate) fn dequantize_w<L: QuantMethod + ?Sized>(layer: &L) -> Result<ArrayD<f32>> {
    from_shape(layer.weight_shape(), layer.dequantize_w_vec()?)
}

/// `add_delta_w`: `delta` must have the weight's shape.
pub(crate) fn add_delta_w<L: QuantMethod + ?Sized>(
    layer: &L,
    delta: ArrayViewD<'_, f32>,
) -> Result<Arc<dyn QuantMethod>> {
    let shape = layer.weight_shape();
    if delta.shape() != shape.as_slice() {
        return Err(QuantError::dims(
            "delta shape",
            format!("{shape:?}"),
            format!("{:?}", delta.shape()),
        ));
    }
    layer.add_delta_w_slice(contiguous(&delta, "delta")?)
}
