//! `_cuda_bench`: kernel time of a `QuantizedWeight` or layer placed on a
//! GPU, for benches/bench_gpu.py. Its own file so that the device functions
//! (`gpu/functions.rs`) do not import the classes that import them back.

use pyo3::prelude::*;

use super::errors::invalid;
use super::gpu::array::{DType, DeviceArray};
use super::gpu::input::device_input;
use super::gpu::layer::CudaLayer;
use super::gpu::weight::CudaWeight;
use crate::error::QuantError;

/// Benchmark helper: queue `iters` calls of `obj` (the matmul of a
/// `QuantizedWeight` or the forward of a layer placed on a GPU) on the CUDA
/// input `x` back to back,
/// after one warm-up, and return the mean seconds per call measured with
/// CUDA events (kernel time with launches pipelined; no host round trip).
#[pyfunction]
#[pyo3(name = "_cuda_bench")]
fn bench_calls(obj: &Bound<'_, PyAny>, x: &Bound<'_, PyAny>, iters: usize) -> PyResult<f64> {
    use cudarc::driver::{result as cu, sys};
    let py = obj.py();
    let iters = iters.max(1);
    enum Placed<'a> {
        Weight(&'a CudaWeight),
        Layer(&'a CudaLayer),
    }
    let placed = match crate::python::int4::cuda_weight(obj) {
        Some(w) => Placed::Weight(w),
        None => Placed::Layer(crate::python::linear::cuda_layer(obj).ok_or_else(|| {
            invalid(
                "obj",
                "expected a QuantizedWeight or a linear layer placed on a GPU (.to('cuda'))",
            )
        })?),
    };
    let (g, in_feat, out_feat) = match placed {
        Placed::Weight(w) => {
            let w = &w.inner;
            (w.gpu().clone(), w.in_feat(), w.out_feat())
        }
        Placed::Layer(l) => {
            let l = &l.inner;
            (l.gpu().clone(), l.in_features(), l.out_features())
        }
    };
    let xi = device_input(&g, x, "x", DType::F32, "the object")?;
    if xi.shape.len() != 2 || xi.shape[1] != in_feat {
        return Err(
            QuantError::dims("x", format!("[rows, {in_feat}]"), format!("{:?}", xi.shape)).into(),
        );
    }
    let rows = xi.shape[0];
    let mut y = DeviceArray::empty(&g, vec![rows, out_feat], DType::F32)?;
    let x = xi.view::<f32>()?;
    let mut yv = y.view_mut::<f32>()?;
    let mut call = || -> crate::Result<()> {
        match placed {
            Placed::Weight(w) => w.inner.matmul(&x, rows, &mut yv),
            Placed::Layer(l) => l.inner.forward(&x, rows, &mut yv),
        }
    };
    call()?;
    g.synchronize()?;
    g.bind()?;
    let ev = |what| {
        cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| crate::gpu::context::gpu_err(what, e))
    };
    let (start, end) = (ev("creating an event")?, ev("creating an event")?);
    let mut run = || -> crate::Result<f32> {
        // SAFETY: fresh events of the bound context, recorded on the null
        // stream around the queued calls, destroyed below.
        unsafe {
            cu::event::record(start, cu::stream::null())
                .map_err(|e| crate::gpu::context::gpu_err("event", e))?;
            for _ in 0..iters {
                call()?;
            }
            cu::event::record(end, cu::stream::null())
                .map_err(|e| crate::gpu::context::gpu_err("event", e))?;
            cu::event::synchronize(end).map_err(|e| crate::gpu::context::gpu_err("event", e))?;
            cu::event::elapsed(start, end).map_err(|e| crate::gpu::context::gpu_err("event", e))
        }
    };
    let r = run();
    let _ = g.synchronize();
    // SAFETY: created above, no longer recorded anywhere.
    unsafe {
        let _ = cu::event::destroy(start);
        let _ = cu::event::destroy(end);
    }
    let _ = py;
    Ok(f64::from(r?) * 1e-3 / iters as f64)
}

/// Adds `_cuda_bench` to `_core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(bench_calls, m)?)?;
    Ok(())
}
