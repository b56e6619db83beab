//! Criterion benches of the INT4 kernels at every available SIMD level:
//! `cargo bench --bench int4`. The Python script `benches/bench_int4.py`
//! compares against NumPy; this one isolates the Rust kernels.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use quantrs::int4::MatvecKernel;
use quantrs::simd::available_levels;
use quantrs::QuantizedWeight;

/// Deterministic f32 in [-1, 1) (xorshift, as in the crate's tests).
fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn kernels(c: &mut Criterion) {
    let (k, n) = (4096, 4096);
    let qw = QuantizedWeight::try_quantize(&rand_vec(k * n, 1), k, n).unwrap();
    let mut group = c.benchmark_group("int4");
    group.sample_size(20);
    for batch in [1usize, 32] {
        let x = rand_vec(batch * k, 2);
        let mut y = vec![0.0f32; batch * n];
        group.throughput(Throughput::Elements((batch * k * n) as u64));
        for level in available_levels() {
            let id = BenchmarkId::new(format!("matmul_b{batch}"), level.name());
            group.bench_function(id, |b| {
                b.iter(|| {
                    qw.matmul_with(&x, batch, &mut y, level, batch >= 8)
                        .unwrap()
                })
            });
        }
    }
    // Every matvec kernel of this machine (the VNNI one is not a SIMD level
    // of its own), on a matrix that stays in L3: the kernels' own speed.
    let x = rand_vec(k, 4);
    let mut y = vec![0.0f32; n];
    group.throughput(Throughput::Elements((k * n) as u64));
    for kernel in MatvecKernel::available() {
        let id = BenchmarkId::new("matvec_kernel", kernel.name());
        group.bench_function(id, |b| {
            b.iter(|| qw.matvec_with(&x, &mut y, kernel).unwrap())
        });
    }
    group.bench_function("quantize_4096x4096_g32", |b| {
        let w = rand_vec(k * n, 3);
        b.iter(|| QuantizedWeight::try_quantize(&w, k, n).unwrap())
    });
    group.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
