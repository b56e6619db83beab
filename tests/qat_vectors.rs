//! The NumPy reference's vectors (`tests/data/qat_vectors.json`, written by
//! `tests/python/test_qat_vectors.py`) checked against the Rust core, bit for
//! bit. Floats are stored as IEEE-754 bit patterns.

use quantrs::fp8::Fp8Format;
use quantrs::qat::{
    fake_quant_fp8, fake_quant_int, IntDtype, QatConfig, QatOptimizer, QuantParams, QuantScheme,
    QuantTarget, Rounding,
};
use serde_json::Value;

fn load() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/qat_vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn f(v: &Value) -> f64 {
    f64::from_bits(v.as_u64().unwrap())
}

fn fs(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(f).collect()
}

fn same_bits(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(x.to_bits() == y.to_bits(), "{what}[{i}]: {x:e} vs {y:e}");
    }
}

#[test]
fn integer_fake_quant_matches_reference() {
    for case in load()["int"].as_array().unwrap() {
        let d = match case["target"].as_str().unwrap() {
            "int8" => IntDtype::Int8,
            _ => IntDtype::Int4,
        };
        let s = QuantScheme::parse(case["scheme"].as_str().unwrap()).unwrap();
        let x = fs(&case["x"]);
        let p = quantrs::qat::calibrate(&x, d, s, 0.0).unwrap();
        let zp = case["zero_point"].as_i64().unwrap() as i32;
        assert_eq!(p.scale.to_bits(), f(&case["scale"]).to_bits());
        assert_eq!(p.zero_point, zp);
        assert_eq!(p.qmin as i64, case["qmin"].as_i64().unwrap());
        assert_eq!(p.qmax as i64, case["qmax"].as_i64().unwrap());
        let p2 = QuantParams::new(p.scale, zp, p.qmin, p.qmax).unwrap();
        let mut out = vec![0.0; x.len()];
        fake_quant_int(&x, &mut out, &p2, Rounding::Nearest).unwrap();
        same_bits(&out, &fs(&case["fake"]), "fake");
    }
}

#[test]
fn fp8_grid_matches_reference() {
    for case in load()["fp8"].as_array().unwrap() {
        let fmt = Fp8Format::parse(case["target"].as_str().unwrap()).unwrap();
        let x = fs(&case["x"]);
        let mut out = vec![0.0; x.len()];
        fake_quant_fp8(&x, &mut out, fmt, Rounding::Nearest).unwrap();
        same_bits(&out, &fs(&case["fake"]), "fp8");
    }
}

#[test]
fn adamw_step_matches_reference() {
    let case = &load()["adamw"][0];
    let h = &case["hyper"];
    let mut c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    (c.lr, c.beta1, c.beta2, c.eps, c.weight_decay) = (
        f(&h["lr"]),
        f(&h["beta1"]),
        f(&h["beta2"]),
        f(&h["eps"]),
        f(&h["weight_decay"]),
    );
    let t = case["t"].as_u64().unwrap();
    let mut w = fs(&case["w"]);
    let n = w.len();
    let q0 = w.clone();
    // Rebuild an optimizer at step t - 1 holding the given moments.
    let opt = QatOptimizer::with_seed(&w, c, 0).unwrap();
    let params = opt.quant_params().copied();
    let mut opt =
        QatOptimizer::from_parts(c, 0, t - 1, fs(&case["m"]), fs(&case["v"]), q0, params).unwrap();
    opt.step_seeded(&mut w, &fs(&case["g"]), None).unwrap();
    assert_eq!(opt.step_count(), t);
    same_bits(&w, &fs(&case["new_w"]), "w");
    let (m, v) = opt.moments();
    same_bits(m, &fs(&case["new_m"]), "m");
    same_bits(v, &fs(&case["new_v"]), "v");
    same_bits(
        opt.quantized_slice(),
        &fs(&case["quantized_int8"]),
        "quantized",
    );
    assert_eq!(n, opt.len());
}
