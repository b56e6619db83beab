//! Integer size arguments and caller-sized allocations (docs/security.md).
//!
//! PyO3's own `usize` extraction raises `OverflowError` without the
//! argument's name for `-2` or `2**70`; each size argument here is a
//! `from_py_with` function that names the argument and the accepted range
//! (`InvalidArgument`, a `ValueError`), and a wrong Python type is a
//! `TypeError` ("n: expected int, got float"). Buffers whose length the caller chooses are reserved with
//! `try_reserve` after a check against the machine's memory, so a huge size
//! is a `MemoryError`, never an abort.

use pyo3::exceptions::{PyMemoryError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use crate::error::QuantError;
use crate::python::errors::type_name;

/// `obj` as an integer in `[lo, hi]`, or an error naming `arg`.
pub(crate) fn int_in(obj: &Bound<'_, PyAny>, arg: &str, lo: i64, hi: i64) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() || !(obj.is_instance_of::<PyInt>() || has_index(obj)) {
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected int, got {}",
            type_name(obj)
        )));
    }
    let range = || format!("an int in [{lo}, {hi}]");
    let shown = || obj.str().map(|s| s.to_string()).unwrap_or_default();
    match obj.extract::<i64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(QuantError::arg(format!("{arg}: expected {}, got {}", range(), shown())).into()),
    }
}

fn has_index(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr("__index__").unwrap_or(false)
}

/// The largest element count any size argument accepts (2**40: 4 TiB of
/// float32, beyond any machine, still far below `usize` overflow).
pub(crate) const MAX_ELEMS: i64 = 1 << 40;

macro_rules! size_args {
    ($($name:ident: $lo:expr, $hi:expr;)*) => {
        $(
            #[doc = concat!("The `", stringify!($name), "` argument (see the module notes).")]
            pub(crate) fn $name(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
                int_in(obj, stringify!($name), $lo, $hi).map(|v| v as usize)
            }
        )*
    };
}

size_args! {
    n: 0, MAX_ELEMS;
    in_feat: 1, MAX_ELEMS;
    out_feat: 1, MAX_ELEMS;
    num_groups: 1, MAX_ELEMS;
    group_size: 1, MAX_ELEMS;
    block_size: 1, MAX_ELEMS;
    accumulation_steps: 1, MAX_ELEMS;
    axis: 0, 63;
    momentum_elements: 0, MAX_ELEMS;
    variance_elements: 0, MAX_ELEMS;
    third_moment_elements: 0, MAX_ELEMS;
    total_bytes: 0, i64::MAX;
    num_parameters: 0, MAX_ELEMS;
    threads: 1, 1 << 20;
    // A row range of a weight (`dequantize_rows`).
    start: 0, MAX_ELEMS;
    stop: 0, MAX_ELEMS;
    // The row layout of a sharded parameter's optimizer state.
    first_row: 0, MAX_ELEMS;
    global_rows: 1, MAX_ELEMS;
    // A restored step count: bounded like the checkpoints' (2**53, exact in
    // the float64 that torch state dicts carry).
    step: 0, 1 << 53;
}

macro_rules! i32_args {
    ($($name:ident;)*) => {
        $(
            #[doc = concat!("The `", stringify!($name), "` argument (a 32-bit code).")]
            pub(crate) fn $name(obj: &Bound<'_, PyAny>) -> PyResult<i32> {
                int_in(obj, stringify!($name), i32::MIN.into(), i32::MAX.into()).map(|v| v as i32)
            }
        )*
    };
}

i32_args! {
    zero_point;
    qmin;
    qmax;
}

/// Optional size arguments (`None` passes through).
macro_rules! opt_size_args {
    ($($name:ident => $inner:ident;)*) => {
        $(
            #[doc = concat!("`", stringify!($inner), "`, or None.")]
            pub(crate) fn $name(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
                if obj.is_none() {
                    Ok(None)
                } else {
                    $inner(obj).map(Some)
                }
            }
        )*
    };
}

opt_size_args! {
    opt_in_feat => in_feat;
    opt_out_feat => out_feat;
    opt_axis => axis;
}

/// Physical memory plus swap in bytes (Linux); `None` where unknown.
fn memory_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)) * 1024)
}

/// A vector of `len` copies of `fill` whose length the caller chose, or a
/// `MemoryError` naming `arg` when it cannot exist on this machine.
pub(crate) fn alloc<T: Clone>(len: usize, fill: T, arg: &str) -> PyResult<Vec<T>> {
    let bytes = (len as u128) * std::mem::size_of::<T>() as u128;
    let too_big = || {
        PyMemoryError::new_err(format!(
            "{arg}: cannot allocate {len} elements ({bytes} bytes)"
        ))
    };
    if memory_limit().is_some_and(|m| bytes > m as u128) {
        return Err(too_big());
    }
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| too_big())?;
    v.resize(len, fill);
    Ok(v)
}
