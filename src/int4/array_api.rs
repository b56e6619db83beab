//! ndarray conveniences on [`QuantizedWeight`] (docs/rust.md): the slice
//! methods with shapes taken from `ArrayView2` / `ArrayView1`.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use super::QuantizedWeight;
use crate::error::{QuantError, Result};

fn contiguous<'a, T, D: ndarray::Dimension>(
    a: &'a ndarray::ArrayView<'_, T, D>,
    what: &str,
) -> Result<&'a [T]> {
    a.as_slice().ok_or_else(|| {
        QuantError::InvalidArgument(format!(
            "{what}: expected a standard-layout (C contiguous) array, got strides {:?}",
            a.strides()
        ))
    })
}

impl QuantizedWeight {
    /// [`Self::quantize_grouped`] of `w` `[in_feat, out_feat]` (standard
    /// layout; another layout is an error, not a copy).
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use quantrs::QuantizedWeight;
    ///
    /// // w[i, o] = (i - o) / 8, shape [in_feat = 8, out_feat = 3]
    /// let w = Array2::from_shape_fn((8, 3), |(i, o)| (i as f32 - o as f32) / 8.0);
    /// let qw = QuantizedWeight::quantize_array(w.view(), 8)?;
    /// assert_eq!((qw.in_feat(), qw.out_feat(), qw.num_groups()), (8, 3, 1));
    /// // Column 0's scale is absmax / 7 = (7 / 8) / 7.
    /// assert_eq!(qw.scales()[0], 0.875 / 7.0);
    /// let y = qw.matvec_array(array![1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0].view())?;
    /// let wd = qw.dequantize_array();
    /// for o in 0..3 {
    ///     assert!((y[o] - (wd[[0, o]] + wd[[7, o]])).abs() < 1e-6);
    /// }
    /// # Ok::<(), quantrs::QuantError>(())
    /// ```
    pub fn quantize_array(w: ArrayView2<'_, f32>, group_size: usize) -> Result<Self> {
        let (in_feat, out_feat) = w.dim();
        Self::quantize_grouped(contiguous(&w, "w")?, in_feat, out_feat, group_size)
    }

    /// The dequantized weight `[in_feat, out_feat]`.
    pub fn dequantize_array(&self) -> Array2<f32> {
        Array2::from_shape_vec((self.in_feat, self.out_feat), self.dequantize())
            .expect("dequantize returns in_feat * out_feat values")
    }

    /// `y = W^T x` for `x [in_feat]`, `y [out_feat]` ([`Self::matvec`]).
    pub fn matvec_array(&self, x: ArrayView1<'_, f32>) -> Result<Array1<f32>> {
        let mut y = Array1::zeros(self.out_feat);
        let ys = y.as_slice_mut().expect("a new array is contiguous");
        self.try_matvec(contiguous(&x, "x")?, ys)?;
        Ok(y)
    }

    /// `Y = X W` for `X [batch, in_feat]`, `Y [batch, out_feat]`
    /// ([`Self::matmul`]).
    pub fn matmul_array(&self, x: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        let batch = x.nrows();
        if x.ncols() != self.in_feat {
            return Err(QuantError::dims(
                "x shape",
                format!("[batch, {}]", self.in_feat),
                format!("{:?}", x.shape()),
            ));
        }
        // Not zeroed first: the GEMM writes every element (a serial pass
        // over the whole output before the parallel GEMM otherwise).
        let mut y = Array2::<f32>::uninit((batch, self.out_feat));
        let ys = y.as_slice_mut().expect("a new array is contiguous");
        self.view()
            .try_matmul_uninit(contiguous(&x, "x")?, batch, ys)?;
        // SAFETY: `try_matmul_uninit` returned Ok, so it wrote every element.
        Ok(unsafe { y.assume_init() })
    }
}
