//! Lossless checkpoints: the state as named tensors (`state_dict`) and as a
//! safetensors file written atomically (`save_state`).
//!
//! Tensors (all little-endian):
//! - `meta` (u8): UTF-8 JSON with the format name and version, the optimizer
//!   kind, the step, the quantization choices, every parameter's shape, and
//!   a CRC-32 of all other tensors (name, dtype, shape, bytes, in name order)
//!   so a flipped bit anywhere is caught;
//! - `config` (f32[8]): learning_rate, beta1, beta2, epsilon, weight_decay,
//!   adaptation_rate, min_scale, max_scale (exact bits, not decimal text);
//! - per parameter `K` (`n:<name>` or `p:<index>`): `K/m_codes`, `K/v_codes`
//!   (u8), and `K/m_scales` (f32 per block) or `K/m_scale_codes` (u8) +
//!   `K/m_scale_groups` (f32 `[groups, 2]` = max, log2 step); the same for v, or
//!   `K/v_rank1_rows` / `K/v_rank1_cols` (f32).
//!
//! Loading parses and checks everything into a new state first and swaps it
//! in only on success, so a bad checkpoint leaves the optimizer unchanged.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{json, Value};

use super::codebook::VarianceMap;
use super::config::{
    Adam4bitConfig, Adam4bitOptimizerConfig, AdvancedQuantizationConfig, QuantizationMethod,
};
use super::engine::Adam4bitCore;
use super::state::{OptimizerState, ParamState, RowLayout, Scales, VScales};
use crate::error::{QuantError, Result};
use crate::st::{self, Dtype, OwnedTensor};

pub(crate) use super::traits::Tensors;

pub(crate) const FORMAT: &str = "quantrs.adam4bit";
/// Version 2: the checksum also covers `meta` itself (every field except the
/// checksum), and v's double-quantized block scales are rounded without bias
/// (`dither.rs`), so a decoded v scale may lie below its block's maximum; the
/// tensors are laid out as in version 1. Version 1 files (checksum over the other tensors only) still
/// load: their meta is unprotected, so it is accepted only where it agrees
/// exactly with the tensors present (every size is checked against the bytes
/// before anything is allocated) and the step is in range; see
/// docs/security.md. They continue with the version-2 rounding.
pub(crate) const VERSION: u64 = 2;
const LEGACY_VERSION: u64 = 1;

/// The largest step a checkpoint may hold: far beyond any real run, and far
/// enough from `u64::MAX` that `step + 1` can never wrap.
pub(crate) const MAX_STEP: u64 = 1 << 53;

fn kind(core: &Adam4bitCore) -> &'static str {
    if core.decoupled() {
        "AdamW4bit"
    } else {
        "Adam4bit"
    }
}

fn u8_tensor(data: Vec<u8>) -> OwnedTensor {
    OwnedTensor {
        dtype: Dtype::U8,
        shape: vec![data.len()],
        data,
    }
}

fn f32_tensor(v: &[f32], shape: Vec<usize>) -> OwnedTensor {
    OwnedTensor {
        dtype: Dtype::F32,
        shape,
        data: st::f32_to_le(v),
    }
}

fn checksum(t: &Tensors) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for (name, x) in t.iter().filter(|(n, _)| n.as_str() != "meta") {
        h.update(name.as_bytes());
        h.update(&[0]);
        h.update(format!("{}{:?}", x.dtype, x.shape).as_bytes());
        h.update(&x.data);
    }
    h.finalize()
}

/// Version-2 checksum: the tensors' CRC continued over the meta JSON without
/// its `checksum` field (`serde_json`'s map is ordered, so the text is
/// canonical).
fn checksum_with_meta(t: &Tensors, meta: &Value) -> u32 {
    let mut m = meta.clone();
    if let Some(o) = m.as_object_mut() {
        o.remove("checksum");
    }
    let mut h = crc32fast::Hasher::new_with_initial(checksum(t));
    h.update(m.to_string().as_bytes());
    h.finalize()
}

/// `width`: floats per double-quantization group (2: `(max, step)`; 1: the
/// row layout's `max`).
fn put_scales(t: &mut Tensors, key: &str, which: &str, s: &Scales, width: usize) {
    match s {
        Scales::F32(v) => {
            t.insert(
                format!("{key}/{which}_scales"),
                f32_tensor(v, vec![v.len()]),
            );
        }
        Scales::Double { codes, groups } => {
            t.insert(
                format!("{key}/{which}_scale_codes"),
                u8_tensor(codes.clone()),
            );
            t.insert(
                format!("{key}/{which}_scale_groups"),
                f32_tensor(groups, vec![groups.len() / width, width]),
            );
        }
    }
}

/// One parameter's tensors, named `{key}/...`.
pub(crate) fn put_param(t: &mut Tensors, key: &str, p: &ParamState) {
    t.insert(format!("{key}/m_codes"), u8_tensor(p.m_codes.clone()));
    t.insert(format!("{key}/v_codes"), u8_tensor(p.v_codes.clone()));
    let width = if p.rows.is_some() { 1 } else { 2 };
    put_scales(t, key, "m", &p.m_scales, width);
    match &p.v_scales {
        VScales::Block(s) => put_scales(t, key, "v", s, width),
        VScales::Rank1 { rows, cols } => {
            t.insert(
                format!("{key}/v_rank1_rows"),
                f32_tensor(rows, vec![rows.len()]),
            );
            t.insert(
                format!("{key}/v_rank1_cols"),
                f32_tensor(cols, vec![cols.len()]),
            );
        }
    }
}

/// The state of `core` as named tensors.
pub(crate) fn to_tensors(core: &Adam4bitCore) -> Result<Tensors> {
    core.check_config()?;
    let c = core.config();
    let (o, q) = (&c.optimizer, &c.quantization);
    let mut t = Tensors::new();
    let cfg = [
        o.learning_rate,
        o.beta1,
        o.beta2,
        o.epsilon,
        o.weight_decay,
        q.adaptation_rate,
        q.min_scale,
        q.max_scale,
    ];
    t.insert("config".into(), f32_tensor(&cfg, vec![cfg.len()]));
    let mut shapes = serde_json::Map::new();
    for (key, p) in &core.state().params {
        if p.rows.is_some() {
            // Its scale groups and rounding keys depend on the rank's rows:
            // it travels per parameter, with the shard's place (torch's
            // state dict), not in a whole-optimizer file.
            return Err(QuantError::InvalidState(format!(
                "parameter {key:?} is in the row layout of a sharded parameter: export it \
                 with export_param_state"
            )));
        }
        shapes.insert(key.clone(), json!(p.shape));
        put_param(&mut t, key, p);
    }
    let mut meta = json!({
        "format": FORMAT,
        "version": VERSION,
        "optimizer": kind(core),
        "step": core.state().step,
        "method": q.method.name(),
        "variance_map": q.variance_map.name(),
        "block_size": q.block_size,
        "double_quantization": q.double_quantization,
        "rank1_normalization": q.rank1_normalization,
        "params": Value::Object(shapes),
    });
    let sum = checksum_with_meta(&t, &meta);
    meta["checksum"] = json!(sum);
    t.insert("meta".into(), u8_tensor(meta.to_string().into_bytes()));
    Ok(t)
}

fn bad(msg: impl std::fmt::Display) -> QuantError {
    QuantError::ser(format!("optimizer state: {msg}"))
}

struct Reader {
    t: Tensors,
}

impl Reader {
    fn take(&mut self, name: &str, dtype: Dtype, len: usize) -> Result<OwnedTensor> {
        let x = self
            .t
            .remove(name)
            .ok_or_else(|| bad(format!("missing tensor {name:?}")))?;
        if x.dtype != dtype {
            return Err(bad(format!(
                "tensor {name:?}: expected dtype {dtype}, got {}",
                x.dtype
            )));
        }
        let n: usize = x.shape.iter().product();
        let width = if dtype == Dtype::F32 { 4 } else { 1 };
        if n != len || x.data.len() != n * width {
            return Err(bad(format!(
                "tensor {name:?}: expected {len} elements, got shape {:?} ({} bytes)",
                x.shape,
                x.data.len()
            )));
        }
        Ok(x)
    }

    fn f32s(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = st::le_to_f32(&self.take(name, Dtype::F32, len)?.data)?;
        if let Some(x) = v.iter().find(|x| !x.is_finite() || **x < 0.0) {
            return Err(bad(format!(
                "tensor {name:?}: scales must be finite and >= 0, found {x}"
            )));
        }
        Ok(v)
    }

    /// `rows`: the row layout's groups (`max` only).
    fn scales(&mut self, key: &str, which: &str, template: &Scales, rows: bool) -> Result<Scales> {
        Ok(match template {
            Scales::F32(v) => Scales::F32(self.f32s(&format!("{key}/{which}_scales"), v.len())?),
            Scales::Double { codes, groups } => {
                let c = self
                    .take(
                        &format!("{key}/{which}_scale_codes"),
                        Dtype::U8,
                        codes.len(),
                    )?
                    .data;
                let name = format!("{key}/{which}_scale_groups");
                let g = st::le_to_f32(&self.take(&name, Dtype::F32, groups.len())?.data)?;
                let ok = |p: &[f32]| {
                    p[0].is_finite() && p[0] >= 0.0 && (rows || (-1.0..=0.0).contains(&p[1]))
                };
                if !g.chunks(if rows { 1 } else { 2 }).all(ok) {
                    return Err(bad(format!(
                        "tensor {name:?}: expected (max >= 0 finite, step in [-1, 0]) pairs"
                    )));
                }
                Scales::Double {
                    codes: c,
                    groups: g,
                }
            }
        })
    }
}

fn meta_str<'a>(m: &'a Value, k: &str) -> Result<&'a str> {
    m.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("meta: missing or invalid {k:?}")))
}

fn meta_u64(m: &Value, k: &str) -> Result<u64> {
    m.get(k)
        .and_then(Value::as_u64)
        .ok_or_else(|| bad(format!("meta: missing or invalid {k:?}")))
}

fn meta_bool(m: &Value, k: &str) -> Result<bool> {
    m.get(k)
        .and_then(Value::as_bool)
        .ok_or_else(|| bad(format!("meta: missing or invalid {k:?}")))
}

/// Parse and check a state for an optimizer of kind `expect_kind`.
pub(crate) fn parse(t: Tensors, expect_kind: &str) -> Result<(Adam4bitConfig, OptimizerState)> {
    let meta_t = t
        .get("meta")
        .ok_or_else(|| bad("missing tensor \"meta\""))?;
    if meta_t.dtype != Dtype::U8 {
        return Err(bad("tensor \"meta\": expected dtype U8"));
    }
    let meta: Value = serde_json::from_slice(&meta_t.data)
        .map_err(|e| bad(format!("meta is not valid JSON: {e}")))?;
    let version = meta_u64(&meta, "version")?;
    if meta_str(&meta, "format")? != FORMAT || !(version == VERSION || version == LEGACY_VERSION) {
        return Err(bad(format!(
            "expected format {FORMAT} version {LEGACY_VERSION} or {VERSION}"
        )));
    }
    let expected = if version == VERSION {
        checksum_with_meta(&t, &meta)
    } else {
        checksum(&t)
    };
    if meta_u64(&meta, "checksum")? != expected as u64 {
        return Err(bad("checksum mismatch: the state is corrupted"));
    }
    let kind = meta_str(&meta, "optimizer")?;
    if kind != expect_kind {
        return Err(bad(format!(
            "the state belongs to {kind}, cannot load it into {expect_kind}"
        )));
    }
    let mut r = Reader { t };
    r.t.remove("meta");
    let cfg = st::le_to_f32(&r.take("config", Dtype::F32, 8)?.data)?;
    let block_size = meta_u64(&meta, "block_size")?;
    let variance_map = VarianceMap::parse(meta_str(&meta, "variance_map")?)
        .ok_or_else(|| bad("meta: unknown variance_map"))?;
    let config = Adam4bitConfig {
        optimizer: Adam4bitOptimizerConfig {
            learning_rate: cfg[0],
            beta1: cfg[1],
            beta2: cfg[2],
            epsilon: cfg[3],
            weight_decay: cfg[4],
        },
        quantization: AdvancedQuantizationConfig {
            method: QuantizationMethod::parse(meta_str(&meta, "method")?)
                .map_err(|e| bad(format!("meta: {e}")))?,
            block_size: usize::try_from(block_size).map_err(|_| bad("block_size"))?,
            adaptation_rate: cfg[5],
            min_scale: cfg[6],
            max_scale: cfg[7],
            double_quantization: meta_bool(&meta, "double_quantization")?,
            rank1_normalization: meta_bool(&meta, "rank1_normalization")?,
            variance_map,
        },
    };
    config
        .validate()
        .map_err(|e| bad(format!("invalid config: {e}")))?;
    let step = meta_u64(&meta, "step")?;
    if step > MAX_STEP {
        return Err(bad(format!(
            "meta: step: expected a value <= 2**53, got {step}"
        )));
    }
    let mut state = OptimizerState {
        step,
        params: BTreeMap::new(),
    };
    let params = meta
        .get("params")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("meta: missing \"params\""))?;
    for (key, shape) in params {
        let valid_key = key.strip_prefix("n:").is_some()
            || key
                .strip_prefix("p:")
                .is_some_and(|i| i.parse::<usize>().is_ok());
        if !valid_key {
            return Err(bad(format!("invalid parameter key {key:?}")));
        }
        let shape: Vec<usize> = shape
            .as_array()
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or_else(|| bad(format!("{key:?}: invalid shape")))?;
        let p = read_param(&mut r, key, shape, &config.quantization, None)?;
        state.params.insert(key.clone(), p);
    }
    if let Some(extra) = r.t.keys().next() {
        return Err(bad(format!("unexpected tensor {extra:?}")));
    }
    Ok((config, state))
}

/// One parameter's state from the tensors `{key}/...` of `r` (taken out of
/// it): the shape is checked against the bytes present before anything of
/// its size is allocated.
fn read_param(
    r: &mut Reader,
    key: &str,
    shape: Vec<usize>,
    quant: &AdvancedQuantizationConfig,
    rows: Option<RowLayout>,
) -> Result<ParamState> {
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n > 0 && n <= 1 << 40)
        .ok_or_else(|| bad(format!("{key:?}: invalid shape {shape:?}")))?;
    // The template below allocates O(n): check n against the bytes that
    // are actually present first (v_codes holds ceil(n / 2) bytes), so
    // a declared shape never allocates more than the file justifies.
    let v_name = format!("{key}/v_codes");
    let present = r.t.get(&v_name).map(|x| x.data.len());
    if present != Some(n.div_ceil(2)) {
        return Err(bad(format!(
            "{key:?}: shape {shape:?} needs {} bytes in {v_name:?}, found {}",
            n.div_ceil(2),
            present.map_or("none".to_string(), |b| format!("{b} bytes"))
        )));
    }
    let tpl = ParamState::with_rows(&shape, quant, rows);
    let m_codes = r
        .take(&format!("{key}/m_codes"), Dtype::U8, tpl.m_codes.len())?
        .data;
    let v_codes = r
        .take(&format!("{key}/v_codes"), Dtype::U8, tpl.v_codes.len())?
        .data;
    let m_scales = r.scales(key, "m", &tpl.m_scales, rows.is_some())?;
    let v_scales = match &tpl.v_scales {
        VScales::Block(s) => VScales::Block(r.scales(key, "v", s, rows.is_some())?),
        VScales::Rank1 { rows, cols } => VScales::Rank1 {
            rows: r.f32s(&format!("{key}/v_rank1_rows"), rows.len())?,
            cols: r.f32s(&format!("{key}/v_rank1_cols"), cols.len())?,
        },
    };
    Ok(ParamState {
        shape,
        m_codes,
        v_codes,
        m_scales,
        v_scales,
        rows,
    })
}

/// Replace the state of `core` with the one parameter `key` of `shape` at
/// `step`, read from `t` (the tensors `{key}/...` and nothing else): the
/// checks of [`parse`] without `meta` and `config` (the core keeps its
/// configuration). Validated first; unchanged on error.
#[cfg_attr(not(feature = "python"), allow(dead_code))] // the torch adapter's
pub(crate) fn load_param(
    core: &mut Adam4bitCore,
    key: &str,
    shape: Vec<usize>,
    step: u64,
    t: Tensors,
) -> Result<()> {
    if step > MAX_STEP {
        return Err(bad(format!("step: expected a value <= 2**53, got {step}")));
    }
    core.check_config()?;
    let mut r = Reader { t };
    if shape.iter().product::<usize>() > 0 {
        core.check_row_shape(&shape)?;
    }
    let rows = core.row_layout();
    let p = read_param(&mut r, key, shape, &core.config().quantization, rows)?;
    if let Some(extra) = r.t.keys().next() {
        return Err(bad(format!("unexpected tensor {extra:?}")));
    }
    let state = OptimizerState {
        step,
        params: BTreeMap::from([(key.to_string(), p)]),
    };
    core.restore(*core.config(), state);
    Ok(())
}

/// Restore `core` from tensors (validated; unchanged on error).
pub(crate) fn load_tensors(core: &mut Adam4bitCore, t: Tensors) -> Result<()> {
    let (config, state) = parse(t, kind(core))?;
    core.restore(config, state);
    Ok(())
}

/// Serialize to safetensors bytes.
pub(crate) fn to_bytes(core: &Adam4bitCore) -> Result<Vec<u8>> {
    let t = to_tensors(core)?;
    let list: Vec<_> = t
        .iter()
        .map(|(n, x)| (n.as_str(), x.dtype, x.shape.clone(), x.data.as_slice()))
        .collect();
    let meta = HashMap::from([("format".to_string(), FORMAT.to_string())]);
    st::to_bytes(&list, meta)
}

/// Restore from safetensors bytes (validated; unchanged on error).
pub(crate) fn from_bytes(core: &mut Adam4bitCore, bytes: &[u8]) -> Result<()> {
    let f = st::from_bytes(bytes)?;
    load_tensors(core, f.tensors.into_iter().collect())
}

/// Write the state to `path` atomically.
pub(crate) fn save(core: &Adam4bitCore, path: &Path) -> Result<()> {
    st::write_atomic(path, &to_bytes(core)?)
}

/// Read a state written by [`save`].
pub(crate) fn load(core: &mut Adam4bitCore, path: &Path) -> Result<()> {
    from_bytes(core, &crate::atomic::read(path)?)
}
