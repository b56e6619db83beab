//! The multi-tensor step: one call updates a list of parameters, each with
//! its own engine (the torch adapter keeps one engine per parameter), as
//! `torch.optim.AdamW(fused=True)` updates a whole group in one call.
//!
//! Every pair is validated first (the gradients' finiteness checks run in
//! parallel over the whole list), so a bad pair anywhere changes nothing.
//! The updates then run as one rayon job per parameter, largest first, each
//! splitting its own groups of blocks (`state.rs`) into further jobs: rayon's
//! work stealing spreads a list of mixed sizes (GPT-2: 768 to 38 M elements)
//! over the threads without a per-parameter barrier. Each parameter's
//! arithmetic is that of [`Adam4bitCore::update`], so results are the same
//! bits as one `update` per parameter, at every thread count.

use rayon::prelude::*;

use super::adam::{Adam4bit, AdamW4bit};
use super::traits::{ParamMut, ParamRef};
use super::Adam4bitCore;
use crate::error::QuantError;

/// One parameter of a multi-tensor step: its optimizer (one per parameter,
/// as `torch.optim`'s per-parameter state), the parameter and its gradient.
pub struct StepItem<'a> {
    /// The parameter's engine (distinct per item: `&mut`).
    pub(crate) core: &'a mut Adam4bitCore,
    /// The parameter, updated in place.
    pub(crate) param: ParamMut<'a>,
    /// Its gradient.
    pub(crate) grad: &'a [f32],
}

impl<'a> StepItem<'a> {
    /// `opt` updates `param` with `grad` (decoupled weight decay).
    pub fn adamw(opt: &'a mut AdamW4bit, param: ParamMut<'a>, grad: &'a [f32]) -> Self {
        StepItem {
            core: &mut opt.core,
            param,
            grad,
        }
    }

    /// `opt` updates `param` with `grad` (L2 weight decay in the gradient).
    pub fn adam(opt: &'a mut Adam4bit, param: ParamMut<'a>, grad: &'a [f32]) -> Self {
        StepItem {
            core: &mut opt.core,
            param,
            grad,
        }
    }
}

/// Update every item and advance its engine's step counter (as `update`
/// then `step` per item). On error, the index of the first bad item and
/// its error; nothing has changed.
pub fn step_all(items: &mut [StepItem<'_>]) -> Result<(), (usize, QuantError)> {
    let checks: Vec<Result<(), QuantError>> = items
        .par_iter()
        .map(|it| {
            it.core.check_update(
                ParamRef {
                    name: it.param.name,
                    shape: it.param.shape,
                    data: it.param.data,
                },
                it.grad,
            )
        })
        .collect();
    if let Some((i, e)) = checks
        .into_iter()
        .enumerate()
        .find_map(|(i, r)| r.err().map(|e| (i, e)))
    {
        return Err((i, e));
    }
    let mut order: Vec<&mut StepItem<'_>> = items.iter_mut().collect();
    // Largest first: the long jobs start while the short ones fill the gaps.
    order.sort_by_key(|it| std::cmp::Reverse(it.grad.len()));
    order.into_par_iter().for_each(|it| {
        let param = ParamMut {
            name: it.param.name,
            shape: it.param.shape,
            data: &mut *it.param.data,
        };
        it.core.update_checked(param, it.grad);
        it.core.step();
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::{Adam4bitConfig, AdvancedQuantizationConfig};
    use crate::testutil::xorshift_f32;

    fn engine() -> Adam4bitCore {
        let mut c = Adam4bitConfig::default();
        c.optimizer.weight_decay = 0.01;
        c.quantization = AdvancedQuantizationConfig::default();
        Adam4bitCore::new(c, true).unwrap()
    }

    /// Sizes around the group boundary (256 blocks of 64) and a tiny one.
    const SIZES: [usize; 5] = [768, 2, 16384 + 64, 3 * 16384 + 6, 130];

    fn data(seed: u64, n: usize) -> (Vec<f32>, Vec<f32>) {
        (xorshift_f32(seed, n, 1.0), xorshift_f32(seed + 99, n, 0.01))
    }

    /// The items of one step: engine `i` updates `ws[i]` with `grads[i]`.
    fn items<'a>(
        engines: &'a mut [Adam4bitCore],
        ws: &'a mut [Vec<f32>],
        grads: &'a [Vec<f32>],
        shapes: &'a [[usize; 1]],
    ) -> Vec<StepItem<'a>> {
        engines
            .iter_mut()
            .zip(ws.iter_mut())
            .zip(grads)
            .zip(shapes)
            .map(|(((core, w), g), shape)| StepItem {
                core,
                param: ParamMut {
                    name: Some("w"),
                    shape,
                    data: w,
                },
                grad: g,
            })
            .collect()
    }

    #[test]
    fn same_bits_as_one_update_per_parameter() {
        let mut one: Vec<Adam4bitCore> = SIZES.iter().map(|_| engine()).collect();
        let mut many: Vec<Adam4bitCore> = SIZES.iter().map(|_| engine()).collect();
        let mut w1: Vec<Vec<f32>> = SIZES.iter().map(|&n| data(n as u64, n).0).collect();
        let mut w2 = w1.clone();
        for t in 0..4u64 {
            let grads: Vec<Vec<f32>> = SIZES.iter().map(|&n| data(t * 7 + n as u64, n).1).collect();
            for ((e, w), g) in one.iter_mut().zip(&mut w1).zip(&grads) {
                let shape = [w.len()];
                e.update(
                    ParamMut {
                        name: Some("w"),
                        shape: &shape,
                        data: w,
                    },
                    g,
                )
                .unwrap();
                e.step();
            }
            let shapes: Vec<[usize; 1]> = w2.iter().map(|w| [w.len()]).collect();
            step_all(&mut items(&mut many, &mut w2, &grads, &shapes)).unwrap();
        }
        assert_eq!(w1, w2);
        for (a, b) in one.iter().zip(&many) {
            assert_eq!(a.state(), b.state());
        }
        assert_eq!(many[0].state().step, 4);
    }

    #[test]
    fn a_bad_gradient_anywhere_changes_nothing() {
        let mut engines: Vec<Adam4bitCore> = SIZES.iter().map(|_| engine()).collect();
        let mut ws: Vec<Vec<f32>> = SIZES.iter().map(|&n| data(n as u64, n).0).collect();
        let before = ws.clone();
        let mut grads: Vec<Vec<f32>> = SIZES.iter().map(|&n| data(n as u64, n).1).collect();
        grads[3][5] = f32::NAN;
        let shapes: Vec<[usize; 1]> = ws.iter().map(|w| [w.len()]).collect();
        let (i, e) = step_all(&mut items(&mut engines, &mut ws, &grads, &shapes)).unwrap_err();
        assert_eq!(i, 3);
        assert!(e.to_string().contains("grad"), "{e}");
        assert_eq!(ws, before);
        assert!(engines
            .iter()
            .all(|e| e.state().step == 0 && e.num_parameters() == 0));
    }
}
