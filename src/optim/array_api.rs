//! The [`Optimizer`] trait on ndarray views (docs/rust.md): standard
//! layout checked here, then the slice engine does the work.

use ndarray::{ArrayViewD, ArrayViewMutD};

use super::engine::Adam4bitCore;
use super::traits::{ParamMut, ParamRef};
use crate::error::{QuantError, Result};

fn layout_error(what: &str, strides: &[isize]) -> QuantError {
    QuantError::InvalidArgument(format!(
        "{what}: expected a standard-layout (C contiguous) array, got strides {strides:?}"
    ))
}

fn grad_slice<'a>(grad: &'a ArrayViewD<'_, f32>, shape: &[usize]) -> Result<&'a [f32]> {
    if grad.shape() != shape {
        return Err(QuantError::dims(
            "grad shape",
            format!("{shape:?}"),
            format!("{:?}", grad.shape()),
        ));
    }
    grad.as_slice()
        .ok_or_else(|| layout_error("grad", grad.strides()))
}

/// `Optimizer::update` for both public types.
pub(crate) fn update(
    core: &mut Adam4bitCore,
    mut parameter: ArrayViewMutD<'_, f32>,
    grad: ArrayViewD<'_, f32>,
) -> Result<()> {
    let shape = parameter.shape().to_vec();
    let g = grad_slice(&grad, &shape)?;
    let strides = parameter.strides().to_vec();
    let data = parameter
        .as_slice_mut()
        .ok_or_else(|| layout_error("parameter", &strides))?;
    core.update(
        ParamMut {
            name: None,
            shape: &shape,
            data,
        },
        g,
    )
}

/// `Optimizer::accumulate_grad` for both public types.
pub(crate) fn accumulate_grad(
    core: &mut Adam4bitCore,
    parameter: ArrayViewMutD<'_, f32>,
    grad: ArrayViewD<'_, f32>,
) -> Result<()> {
    let shape = parameter.shape().to_vec();
    let g = grad_slice(&grad, &shape)?;
    let data = parameter
        .as_slice()
        .ok_or_else(|| layout_error("parameter", parameter.strides()))?;
    core.accumulate_grad(
        ParamRef {
            name: None,
            shape: &shape,
            data,
        },
        g,
    )?;
    Ok(())
}

/// `Optimizer::apply_accumulated_grads` for both public types: each view is
/// matched to its accumulation buffer by address and length.
pub(crate) fn apply_accumulated_grads(
    core: &mut Adam4bitCore,
    accumulation_steps: usize,
    parameters: &mut [ArrayViewMutD<'_, f32>],
) -> Result<()> {
    let shapes: Vec<Vec<usize>> = parameters.iter().map(|p| p.shape().to_vec()).collect();
    let mut params = Vec::with_capacity(parameters.len());
    for (i, (p, shape)) in parameters.iter_mut().zip(&shapes).enumerate() {
        let strides = p.strides().to_vec();
        let data = p
            .as_slice_mut()
            .ok_or_else(|| layout_error(&format!("parameters[{i}]"), &strides))?;
        let key = core.key_of(None, data.as_ptr() as usize, data.len());
        params.push((
            key,
            ParamMut {
                name: None,
                shape,
                data,
            },
        ));
    }
    core.apply_accumulated_grads(accumulation_steps, &mut params)
}
