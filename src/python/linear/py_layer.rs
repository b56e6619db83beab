//! `py_layer!`: the `#[pymethods]` block of a layer class, the class's own
//! constructors and properties followed by the `QuantMethod` surface every
//! layer shares (each method a call into `base.rs`).

/// The methods every layer class shares (one `#[pymethods]` block per
/// class: `$extra` holds the class's constructors and own properties).
macro_rules! py_layer {
    ($py:ident, $core:ty, { $($extra:tt)* }) => {
        #[pymethods]
        impl $py {
            $($extra)*

            /// `y = x @ W.T + bias` for float32 `x [..., in]` (on a layer placed
            /// on a GPU: NumPy in and out, or a CUDA array in and a
            /// `quantrs.cuda.DeviceArray` out).
            fn forward<'py>(&self, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
                match &self.cuda {
                    Some(c) => Ok(c.forward(x)?.into_bound(x.py())),
                    None => super::base::forward_f32(&*self.inner, x),
                }
            }

            /// The same as `forward`.
            fn __call__<'py>(&self, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
                self.forward(x)
            }

            /// Where `forward` runs: `"cpu"` or `"cuda:N"`.
            #[getter]
            fn device(&self) -> String {
                crate::python::gpu::placement_name(self.cuda.as_ref().map(|c| c.ordinal()))
            }

            /// This layer on `device` ("cpu", "cuda", "cuda:N"), as `Tensor.to`
            /// does: itself when it is there already, else a new layer (sharing
            /// the host value) whose `forward` runs there.
            fn to<'py>(slf: &Bound<'py, Self>, device: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
                let py = slf.py();
                let this = slf.get();
                let here = this.cuda.as_ref().map(|c| c.ordinal());
                let cuda = match crate::python::gpu::parse_device(device)? {
                    $crate::linear::Device::Cpu if here.is_none() => return Ok(slf.clone()),
                    $crate::linear::Device::Cuda(i) if here == Some(i) => return Ok(slf.clone()),
                    $crate::linear::Device::Cpu => None,
                    $crate::linear::Device::Cuda(i) => {
                        Some(crate::python::gpu::CudaLayer::from_layer(py, this.inner.clone(), i)?)
                    }
                };
                Bound::new(py, $py { inner: this.inner.clone(), cuda })
            }

            /// `forward` for float16/32/64 or bfloat16 input, returning that dtype.
            fn forward_autocast<'py>(&self, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
                self.host_only("forward_autocast")?;
                super::base::autocast(x, |x32| super::base::forward_f32(&*self.inner, x32))
            }

            /// Expert-stacked forward: `x [tokens, in]`, `indices [tokens, k]`
            /// -> `[tokens, k, out]`, row `t` through expert `indices[t, j]`.
            fn gather_forward<'py>(
                &self,
                x: &Bound<'py, PyAny>,
                indices: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                self.host_only("gather_forward")?;
                super::base::gather_f32(&*self.inner, x, indices)
            }

            /// `gather_forward` for float16/32/64 or bfloat16 `x`, returning that dtype.
            fn gather_forward_autocast<'py>(
                &self,
                x: &Bound<'py, PyAny>,
                indices: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                self.host_only("gather_forward_autocast")?;
                super::base::autocast(x, |x32| super::base::gather_f32(&*self.inner, x32, indices))
            }

            /// The dequantized weight, float32, shape `weight_shape`.
            fn dequantize_w<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                super::base::dequantize_w(py, &*self.inner)
            }

            /// `(W, bias)` in float32 (bias may be None).
            fn unquant_weight_bias<'py>(&self, py: Python<'py>) -> PyResult<super::base::WeightBias<'py>> {
                super::base::unquant_weight_bias(py, &*self.inner)
            }

            /// A new layer for `W + delta` (LoRA merge), re-quantized; its
            /// `merge_error` is the relative Frobenius error of that step.
            fn add_delta_w(&self, py: Python<'_>, delta: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
                super::base::add_delta_w(py, &*self.inner, delta)
            }

            /// `(weight dtype, device)`, e.g. `("float8_e4m3fn", "cpu")`.
            fn dtype_and_device(&self) -> (&'static str, String) {
                let (d, _) = self.inner.dtype_and_device();
                (d.name(), self.device())
            }

            /// `"float8_e4m3fn"` when activations are quantized, else None.
            fn quantized_act_type(&self) -> Option<&'static str> {
                self.inner.quantized_act_type().map(|_| "float8_e4m3fn")
            }

            /// A new layer in another quantization: "int4", "fp8_e4m3", "int8"
            /// or None (float32).
            #[pyo3(
                signature = (dtype, device = "cpu".to_owned(), imatrix_weight = None, *, group_size = 32),
                text_signature = "($self, dtype, device='cpu', imatrix_weight=None, *, group_size=32)"
            )]
            fn apply_isq(
                &self,
                py: Python<'_>,
                #[pyo3(from_py_with = crate::python::scalars::opt_text::dtype)] dtype: Option<String>,
                #[pyo3(from_py_with = crate::python::scalars::text::device)] device: String,
                imatrix_weight: Option<&Bound<'_, PyAny>>,
                #[pyo3(from_py_with = crate::python::sizes::group_size)] group_size: usize,
            ) -> PyResult<Py<PyAny>> {
                super::base::apply_isq(py, self.inner.clone(), dtype.as_deref(), &device, imatrix_weight, group_size)
            }

            /// Start tracking the imatrix (mean of x_i^2 over forward rows).
            fn begin_track_stats(&self) -> PyResult<()> {
                self.host_only("begin_track_stats")?;
                Ok(self.inner.begin_track_stats()?)
            }

            /// The imatrix, float32 `[in]`; tracking stops.
            fn end_track_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                super::base::end_track_stats(py, &*self.inner)
            }

            /// Always None: these layers are not tensor-parallel.
            fn is_distributed(&self) -> Option<&'static str> {
                self.inner.is_distributed().map(|_| "distributed")
            }

            /// The serialization name of the layer type.
            fn name(&self) -> &'static str {
                $crate::linear::QuantizedSerde::name(&*self.inner)
            }

            /// Whether `serialize` is supported (True for every layer here).
            fn isq_serde_supported(&self) -> bool {
                $crate::linear::QuantizedSerde::isq_serde_supported(&*self.inner)
            }

            /// The layer as versioned, CRC-checked bytes.
            fn serialize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, ::pyo3::types::PyBytes>> {
                let b = $crate::linear::QuantizedSerde::serialize(&*self.inner)?;
                Ok(::pyo3::types::PyBytes::new(py, &b))
            }

            /// The layer with `bias` (or none) in place of its own, as bytes.
            #[pyo3(signature = (bias = None))]
            fn serialize_with_bias<'py>(
                &self,
                py: Python<'py>,
                bias: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<Bound<'py, ::pyo3::types::PyBytes>> {
                super::base::serialize_with_bias(py, &*self.inner, bias)
            }

            /// Rebuild a layer from `serialize()` bytes.
            #[staticmethod]
            fn deserialize(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
                super::base::deserialize::<$core>(py, data)
            }

            /// `(layer without bias, bias or None)` from bytes.
            #[staticmethod]
            fn deserialize_ext_bias<'py>(
                py: Python<'py>,
                data: &Bound<'py, PyAny>,
            ) -> PyResult<super::base::LayerBias<'py>> {
                super::base::deserialize_ext_bias::<$core>(py, data)
            }

            /// Relative Frobenius error of the `add_delta_w` that made this
            /// layer (None otherwise).
            #[getter]
            fn merge_error(&self) -> Option<f64> {
                self.inner.merge_error()
            }

            /// Input features (the weight's last axis).
            #[getter]
            fn in_features(&self) -> usize {
                self.inner.in_features()
            }

            /// Output features.
            #[getter]
            fn out_features(&self) -> usize {
                self.inner.out_features()
            }

            /// The weight's logical shape, `(out, in)` or `(E, out, in)`.
            #[getter]
            fn weight_shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, ::pyo3::types::PyTuple>> {
                ::pyo3::types::PyTuple::new(py, self.inner.weight_shape())
            }

            /// The float32 bias (a copy), or None.
            #[getter]
            fn bias<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
                super::base::bias(py, &*self.inner)
            }

            fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, ::pyo3::types::PyTuple>> {
                super::base::reduce(&slf.py().get_type::<Self>(), &*slf.get().inner)
            }
        }

        impl $py {
            /// `Err` naming the device when this layer is placed on a GPU: the
            /// method runs on the host only.
            fn host_only(&self, what: &str) -> PyResult<()> {
                match &self.cuda {
                    Some(c) => Err(super::base::host_only(what, c.ordinal())),
                    None => Ok(()),
                }
            }
        }
    };
}
pub(super) use py_layer;
