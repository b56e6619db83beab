//! Fuzzing of every deserializer through the public API (docs/security.md):
//! QuantizedWeight::from_safetensors_bytes (the safetensors reader), the
//! layers' `deserialize`, `QatOptimizer::from_bytes` and the 4-bit
//! optimizers' `load_state_dict`. Inputs are valid encodings mutated
//! structurally (bit flips, byte writes, cuts, insertions, and numbers in the
//! JSON headers replaced by extreme ones, then re-sealed so the checksum
//! passes and validation alone must catch them).
//!
//! Every input must give `Ok` or an error: a panic fails the case (proptest
//! reports the minimal input) and an allocation above 256 MiB aborts the
//! binary (the allocator below refuses it), so an input that makes the
//! reader allocate what its own size does not justify fails the run.
//!
//! Cases per target: `QUANTRS_FUZZ_CASES` (default 300, a few seconds in
//! all). The long run: `QUANTRS_FUZZ_CASES=200000 cargo test --release
//! --test fuzz_deserializers`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::borrow::Cow;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use proptest::prelude::*;
use quantrs::linear::{Device, Int8Linear, PerTensorFP8Linear, QuantMethod, QuantizedSerde};
use quantrs::optim::{AdamW4bit, Optimizer, ParamMut, StatefulOptimizer};
use quantrs::qat::{IntDtype, QatConfig, QatOptimizer, QuantTarget};
use quantrs::{QuantError, QuantizedWeight};

/// Refuses any single allocation above 256 MiB (a null return: `try_reserve`
/// sees an error, an infallible allocation aborts the binary).
struct Capped;

const CAP: usize = 256 << 20;

// SAFETY: forwards to the system allocator unchanged, except that requests
// above CAP get null, which `GlobalAlloc` allows.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;

fn cases() -> u32 {
    std::env::var("QUANTRS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn vals(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            ((i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % 2001) as f32 / 1e3 - 1.0
        })
        .collect()
}

/// One structural mutation.
#[derive(Clone, Debug)]
enum Edit {
    Flip(usize),
    Set(usize, u8),
    Cut(usize),
    Insert(usize, Vec<u8>),
    /// Replace the `k`-th run of ASCII digits by this number.
    Number(usize, u64),
}

fn edit() -> impl Strategy<Value = Edit> {
    let extreme = prop_oneof![
        Just(0u64),
        Just(u64::MAX),
        Just(1 << 32),
        Just(1 << 36),
        Just(1 << 62),
        Just((1 << 53) + 1),
        any::<u64>(),
        0u64..100,
    ];
    prop_oneof![
        any::<usize>().prop_map(Edit::Flip),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        any::<usize>().prop_map(Edit::Cut),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, v)| Edit::Insert(i, v)),
        (0usize..64, extreme.clone()).prop_map(|(k, v)| Edit::Number(k, v)),
        (0usize..64, extreme).prop_map(|(k, v)| Edit::Number(k, v)),
    ]
}

fn apply(b: &mut Vec<u8>, e: &Edit) {
    if b.is_empty() {
        return;
    }
    let n = b.len();
    match e {
        Edit::Flip(i) => b[i % n] ^= 1 << (i % 8),
        Edit::Set(i, v) => b[i % n] = *v,
        Edit::Cut(i) => b.truncate(i % n),
        Edit::Insert(i, v) => {
            let at = i % n;
            b.splice(at..at, v.iter().copied());
        }
        Edit::Number(k, v) => {
            let runs = digit_runs(b);
            if !runs.is_empty() {
                let (s, t) = runs[k % runs.len()];
                b.splice(s..t, v.to_string().bytes());
            }
        }
    }
}

fn digit_runs(b: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let s = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            out.push((s, i));
        } else {
            i += 1;
        }
    }
    out
}

/// A safetensors file with its header edited (the length prefix fixed up so
/// the edit reaches the JSON parser, not just the framing check).
fn edit_header(file: &[u8], edits: &[Edit]) -> Vec<u8> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let mut header = file[8..8 + n].to_vec();
    for e in edits {
        apply(&mut header, e);
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&file[8 + n..]);
    out
}

fn check<T>(r: Result<T, QuantError>) -> Result<(), TestCaseError> {
    match r {
        Ok(_) => Ok(()),
        Err(QuantError::Serialization(_)) | Err(QuantError::DimensionMismatch { .. }) => Ok(()),
        Err(QuantError::InvalidArgument(_)) => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!("unexpected error kind: {e}"))),
    }
}

fn int4_bytes() -> Vec<u8> {
    QuantizedWeight::try_quantize(&vals(64 * 3, 1), 64, 3)
        .unwrap()
        .to_safetensors_bytes()
        .unwrap()
}

fn layer_blobs() -> Vec<(u8, Vec<u8>)> {
    let fp8 =
        PerTensorFP8Linear::from_float(&vals(40, 2), vec![4, 10], Some(vals(4, 3)), Some(0.5))
            .unwrap();
    let int8 = Int8Linear::from_float(&vals(40, 4), 4, 10, Some(vals(4, 5))).unwrap();
    vec![
        (0, fp8.serialize().unwrap().into_owned()),
        (1, int8.serialize().unwrap().into_owned()),
    ]
}

fn deser(kind: u8, data: &[u8]) -> Result<Arc<dyn QuantMethod>, QuantError> {
    let d = Cow::Borrowed(data);
    match kind {
        0 => PerTensorFP8Linear::deserialize(d, &Device::Cpu),
        _ => Int8Linear::deserialize(d, &Device::Cpu),
    }
}

fn qat_bytes() -> Vec<u8> {
    let cfg = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    QatOptimizer::<f32>::with_seed(&vals(50, 6), cfg, 3)
        .unwrap()
        .to_bytes()
}

fn trained_state() -> quantrs::optim::Tensors {
    let mut o = AdamW4bit::new(1e-3, 0.9, 0.999, 1e-8, 0.01);
    let mut w = vals(6 * 20, 7);
    o.update_param(
        ParamMut {
            name: Some("w"),
            shape: &[6, 20],
            data: &mut w,
        },
        &vals(120, 8),
    )
    .unwrap();
    o.step();
    o.state_dict().unwrap()
}

/// Recompute the version-2 checksum of a state whose meta was edited (as a
/// forger would), so only validation stands between the edit and the
/// optimizer.
fn reseal(t: &mut quantrs::optim::Tensors) {
    let Some(meta) = t.get("meta") else { return };
    let Ok(mut m) = serde_json::from_slice::<serde_json::Value>(&meta.data) else {
        return;
    };
    let Some(o) = m.as_object_mut() else { return };
    o.remove("checksum");
    let mut h = crc32fast::Hasher::new();
    for (name, x) in t.iter().filter(|(n, _)| n.as_str() != "meta") {
        h.update(name.as_bytes());
        h.update(&[0]);
        h.update(format!("{}{:?}", x.dtype, x.shape).as_bytes());
        h.update(&x.data);
    }
    let mut h = crc32fast::Hasher::new_with_initial(h.finalize());
    h.update(m.to_string().as_bytes());
    m["checksum"] = serde_json::json!(h.finalize());
    t.get_mut("meta").unwrap().data = m.to_string().into_bytes();
    let len = t["meta"].data.len();
    t.get_mut("meta").unwrap().shape = vec![len];
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_int4_safetensors(edits in proptest::collection::vec(edit(), 1..6), header: bool) {
        let valid = int4_bytes();
        let b = if header {
            edit_header(&valid, &edits)
        } else {
            let mut b = valid;
            for e in &edits { apply(&mut b, e); }
            b
        };
        check(QuantizedWeight::from_safetensors_bytes(&b))?;
    }

    #[test]
    fn fuzz_layer_deserialize(kind in 0u8..2, edits in proptest::collection::vec(edit(), 1..6), reseal_crc: bool) {
        let mut b = layer_blobs()[kind as usize].1.clone();
        for e in &edits { apply(&mut b, e); }
        if reseal_crc && b.len() > 4 {
            let n = b.len() - 4;
            let crc = crc32fast::hash(&b[..n]);
            b[n..].copy_from_slice(&crc.to_le_bytes());
        }
        if let Ok(l) = deser(kind, &b) {
            l.dequantize_w().unwrap();
        }
    }

    #[test]
    fn fuzz_qat_from_bytes(edits in proptest::collection::vec(edit(), 1..6)) {
        let mut b = qat_bytes();
        for e in &edits { apply(&mut b, e); }
        check(QatOptimizer::<f32>::from_bytes(&b))?;
    }

    #[test]
    fn fuzz_optimizer_load_state_dict(
        edits in proptest::collection::vec(edit(), 1..6),
        target in 0usize..16,
        seal: bool,
    ) {
        let mut t = trained_state();
        let name = t.keys().nth(target % t.len()).unwrap().clone();
        {
            let x = t.get_mut(&name).unwrap();
            for e in &edits { apply(&mut x.data, e); }
        }
        if seal { reseal(&mut t); }
        let mut o = AdamW4bit::new(1e-3, 0.9, 0.999, 1e-8, 0.01);
        let before = o.state_dict().unwrap();
        match o.load_state_dict(t) {
            Ok(()) => {}
            Err(QuantError::Serialization(_)) => {
                prop_assert_eq!(o.state_dict().unwrap(), before, "unchanged on error");
            }
            Err(e) => return Err(TestCaseError::fail(format!("not a SerializationError: {e}"))),
        }
    }

    #[test]
    fn fuzz_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        check(QuantizedWeight::from_safetensors_bytes(&data))?;
        check(QatOptimizer::<f32>::from_bytes(&data))?;
        for k in 0..2 { let _ = deser(k, &data); }
    }
}

#[test]
fn the_cap_refuses_big_allocations() {
    let mut v: Vec<u8> = Vec::new();
    assert!(v.try_reserve_exact(CAP + 1).is_err());
    let _ = AtomicUsize::new(0);
}

/// Found by `fuzz_int4_safetensors`: `in_feat = 2**64 - 1` in the header
/// wrapped the padded length to 0 and divided by zero.
#[test]
fn int4_huge_in_feat_is_an_error() {
    let qw = QuantizedWeight::try_quantize(&vals(64 * 3, 1), 64, 3).unwrap();
    for in_feat in [usize::MAX, usize::MAX - 1, 1 << 62] {
        let r =
            QuantizedWeight::from_parts(qw.data().to_vec(), qw.scales().to_vec(), in_feat, 3, 2);
        assert!(r.is_err());
    }
}
