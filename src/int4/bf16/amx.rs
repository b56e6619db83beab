//! The bf16-activation INT4 GEMM on the AMX tile unit (`tdpbf16ps`: a
//! 16 x 16 block of f32 sums, 32 bf16 inputs deep, per instruction).
//!
//! Operands. A is 16 rows of one activation plane, 32 inputs (64 bytes)
//! at the plane's row pitch ([`Planes::block`]). B is a panel decoded per
//! chunk of groups: per pair of input rows `p`, 32 columns of one dword
//! holding `(bf16(q[2p]), bf16(q[2p + 1]))`, the tile unit's B layout (16
//! pairs by 16 columns at a stride of 128 bytes, the second tile 64 bytes
//! on). The packed format already stores a pair of input rows per byte, so
//! each byte becomes one dword: its nibbles spread to the two 16-bit halves
//! and mapped to their bf16 bits by a 16-entry table (`vpermw`).
//!
//! A task owns 32 columns (two B tiles) and up to [`ROW_BLOCK`] rows. Per
//! chunk of groups it decodes the panel once, then runs each pair of
//! 16-row blocks group by group: four C tiles (0-3) from two A (4-5) and
//! two B tiles (6-7), stored and added into the task's f32 outputs times the
//! group's scales (the epilogue of the module docs).

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::QuantizedWeightRef;
use super::planes::{Planes, MAX_PARTS};
use super::{bf16_rne, Out};
use crate::linear::tiles::{tile_dot_bf16, tile_load, tile_store, tile_zero, TileConfig, Tiles, T};
use crate::simd::{Amx, Avx512};

/// Columns per task: two B tiles.
const PANEL: usize = 2 * T;
/// Inputs per tile dot.
const KSTEP: usize = 32;
/// Inputs per decoded panel, rounded down to whole groups (at least one):
/// `DEPTH / 2 * PANEL * 4` = 32 KiB, in L1 while every row block reuses it.
const DEPTH: usize = 512;
/// Rows per task: the panel decode is paid once per task, so a task holds
/// several 32-row tile pairs.
const ROW_BLOCK: usize = 256;

/// Four C tiles of 16 x 16 f32, as the tile stores write them.
#[repr(C, align(64))]
struct CTiles([[f32; T * T]; 4]);

/// The output as raw pointers that tasks share; each task writes its own
/// rows and columns.
struct RawOut<'a> {
    f32: *mut f32,
    bf16: *mut u16,
    bias: Option<&'a [f32]>,
}
// SAFETY: tasks write disjoint blocks (their rows times their columns) of
// the one live output buffer, which `gemm` outlives.
unsafe impl Send for RawOut<'_> {}
// SAFETY: as above.
unsafe impl Sync for RawOut<'_> {}

/// `out = x @ W` (see the module docs of `super`).
pub(super) fn gemm(tok: Amx, qw: &QuantizedWeightRef, x: &Planes, out: Out) {
    let (n, rows) = (qw.out_feat, x.rows());
    assert!(x.pitch() >= qw.in_padded() && x.parts() <= MAX_PARTS);
    let raw = match out {
        Out::F32(y) => {
            assert_eq!(y.len(), rows * n);
            RawOut {
                f32: y.as_mut_ptr(),
                bf16: std::ptr::null_mut(),
                bias: None,
            }
        }
        Out::Bf16 { y, bias } => {
            assert!(y.len() == rows * n && bias.is_none_or(|b| b.len() == n));
            RawOut {
                f32: std::ptr::null_mut(),
                bf16: y.as_mut_ptr(),
                bias,
            }
        }
    };
    let panels = n.div_ceil(PANEL);
    let tasks = panels * rows.div_ceil(ROW_BLOCK);
    crate::par::for_each_block(tasks, |t| {
        let (c0, r0) = (t % panels * PANEL, t / panels * ROW_BLOCK);
        task(tok, qw, x, c0, r0..(r0 + ROW_BLOCK).min(rows), &raw);
    });
}

/// Columns `c0 .. c0 + 32` (fewer at the edge) of rows `rows`.
fn task(
    tok: Amx,
    qw: &QuantizedWeightRef,
    x: &Planes,
    c0: usize,
    rows: Range<usize>,
    out: &RawOut,
) {
    let (n, gs, ng) = (qw.out_feat, qw.group_size(), qw.num_groups);
    let nc = PANEL.min(n - c0);
    let per = (DEPTH / gs).max(1);
    let mut panel = vec![0u32; per * gs / 2 * PANEL];
    let mut yacc = vec![[0f32; PANEL]; rows.len()];
    let mut ct = CTiles([[0.0; T * T]; 4]);
    let nblk = rows.len().div_ceil(T);
    let blk0 = rows.start / T;
    let tiles = Tiles::configure(tok, &TileConfig::sixteen_by_64());
    for gb in (0..ng).step_by(per) {
        let ge = (gb + per).min(ng);
        let p0 = gb * gs / 2;
        decode_panel(tok.avx512(), qw, p0..ge * gs / 2, c0, nc, &mut panel);
        for b in (0..nblk).step_by(2) {
            let pair = Pair {
                blk: blk0 + b,
                two: b + 1 < nblk,
            };
            let ys = &mut yacc[b * T..((b + 2) * T).min(rows.len())];
            for g in gb..ge {
                products(&tiles, x, &pair, g * gs..(g + 1) * gs, p0, &panel, &mut ct);
                epilogue(tok.avx512(), &ct, &qw.scales[g * n + c0..][..nc], ys);
            }
        }
    }
    drop(tiles);
    for (j, a) in yacc.iter().enumerate() {
        let at = (rows.start + j) * n + c0;
        // SAFETY: row rows.start + j < x.rows() and columns c0 .. c0 + nc
        // <= n: inside the output (`gemm` checked its length), and in this
        // task's block, which no other task writes.
        unsafe {
            if out.bf16.is_null() {
                std::ptr::copy_nonoverlapping(a.as_ptr(), out.f32.add(at), nc);
            } else {
                for (c, &v) in a[..nc].iter().enumerate() {
                    let v = v + out.bias.map_or(0.0, |b| b[c0 + c]);
                    *out.bf16.add(at + c) = bf16_rne(v);
                }
            }
        }
    }
}

/// A pair of 16-row blocks: `blk` and, if `two`, `blk + 1`.
struct Pair {
    blk: usize,
    two: bool,
}

/// The f32 sums of the inputs `inputs` (one group) of the pair's rows times
/// the panel's 32 columns into `out` (tiles 0, 1: block `blk` by columns
/// 0-15, 16-31; tiles 2, 3: block `blk + 1`). `p0` is the panel's first
/// input pair.
fn products(
    _loaded: &Tiles,
    x: &Planes,
    pair: &Pair,
    inputs: Range<usize>,
    p0: usize,
    panel: &[u32],
    out: &mut CTiles,
) {
    let pitch = x.pitch();
    assert!(inputs.start.is_multiple_of(KSTEP) && inputs.len().is_multiple_of(KSTEP));
    assert!(inputs.end <= pitch && inputs.start / 2 >= p0);
    assert!((inputs.end / 2 - p0) * PANEL <= panel.len());
    let parts = x.parts();
    let mut a = [[std::ptr::null::<u16>(); 2]; MAX_PARTS];
    for (p, ap) in a.iter_mut().enumerate().take(parts) {
        ap[0] = x.block(p, pair.blk).as_ptr();
        if pair.two {
            ap[1] = x.block(p, pair.blk + 1).as_ptr();
        }
    }
    let o = out.0.as_mut_ptr();
    // SAFETY: the configuration (`_loaded`, eight 16 x 64-byte tiles) is
    // loaded on this thread. A loads read 16 rows of 64 bytes at a stride of
    // `pitch` values from value s of a block of `16 * pitch` values, with
    // s + 32 <= inputs.end <= pitch: inside the block. B loads read 16 rows
    // of 64 bytes at a stride of 128 bytes from dword (s / 2 - p0) * 32
    // (+16), ending by (inputs.end / 2 - p0) * 32 <= panel.len() (asserted).
    // Stores write the four 1 KiB tiles of `out` at a 64-byte stride.
    unsafe {
        tile_zero!(0);
        tile_zero!(1);
        tile_zero!(2);
        tile_zero!(3);
        for s in inputs.step_by(KSTEP) {
            let b = panel.as_ptr().add((s / 2 - p0) * PANEL);
            tile_load!(6, b, 4 * PANEL);
            tile_load!(7, b.add(T), 4 * PANEL);
            for ap in &a[..parts] {
                tile_load!(4, ap[0].add(s), 2 * pitch);
                tile_dot_bf16!(0, 4, 6);
                tile_dot_bf16!(1, 4, 7);
                if pair.two {
                    tile_load!(5, ap[1].add(s), 2 * pitch);
                    tile_dot_bf16!(2, 5, 6);
                    tile_dot_bf16!(3, 5, 7);
                }
            }
        }
        tile_store!(0, o);
        tile_store!(1, o.add(1));
        if pair.two {
            tile_store!(2, o.add(2));
            tile_store!(3, o.add(3));
        }
    }
}

/// `ys[j][c] += C[j][c] * scales[c]` for the (at most 32) rows of a pair and
/// the `scales.len()` columns of the panel (one FMA per value).
fn epilogue(tok: Avx512, c: &CTiles, scales: &[f32], ys: &mut [[f32; PANEL]]) {
    assert!(ys.len() <= 2 * T && scales.len() <= PANEL);
    // SAFETY: the token proves AVX-512 F; sizes asserted above.
    unsafe { epilogue_avx512(tok, c, scales, ys) }
}

/// # Safety
/// AVX-512 F must be available (the token); sizes as [`epilogue`] asserts.
#[target_feature(enable = "avx512f")]
unsafe fn epilogue_avx512(_: Avx512, c: &CTiles, scales: &[f32], ys: &mut [[f32; PANEL]]) {
    let nc = scales.len();
    let m0: __mmask16 = if nc >= T { 0xFFFF } else { (1 << nc) - 1 };
    let m1: __mmask16 = match nc {
        PANEL.. => 0xFFFF,
        17.. => (1 << (nc - T)) - 1,
        _ => 0,
    };
    // SAFETY: the masks cover the `nc` scales only.
    let (s0, s1) = unsafe {
        (
            _mm512_maskz_loadu_ps(m0, scales.as_ptr()),
            _mm512_maskz_loadu_ps(m1, scales.as_ptr().wrapping_add(T)),
        )
    };
    for (j, y) in ys.iter_mut().enumerate() {
        let (t, lane) = (2 * (j / T), j % T);
        for (h, sh) in [s0, s1].into_iter().enumerate() {
            // SAFETY: 16 values at row `lane` of C tile `t + h` (16 x 16)
            // and at `y[16 h]` (32 values).
            unsafe {
                let cv = _mm512_loadu_ps(c.0[t + h].as_ptr().add(lane * T));
                let yp = y.as_mut_ptr().add(T * h);
                _mm512_storeu_ps(yp, _mm512_fmadd_ps(cv, sh, _mm512_loadu_ps(yp)));
            }
        }
    }
}

/// bf16 bits of the 4-bit two's complement value of each nibble (entries
/// 16-31 unused: the indices are nibbles).
fn nibble_table() -> [u16; 32] {
    std::array::from_fn(|i| {
        let q = ((i as u8 & 0xF) << 4) as i8 >> 4;
        if i < 16 {
            (f32::from(q).to_bits() >> 16) as u16
        } else {
            0
        }
    })
}

/// The panel of input pairs `pairs` and columns `c0 .. c0 + nc` (the rest of
/// its 32 columns zero) into `panel` (see the module docs).
fn decode_panel(
    tok: Avx512,
    qw: &QuantizedWeightRef,
    pairs: Range<usize>,
    c0: usize,
    nc: usize,
    panel: &mut [u32],
) {
    let n = qw.out_feat;
    assert!(nc <= PANEL && c0 + nc <= n && pairs.end * n <= qw.data.len());
    assert!(pairs.len() * PANEL <= panel.len());
    // SAFETY: the token proves AVX-512 F/BW/VL; sizes asserted above.
    unsafe { decode_panel_avx512(tok, qw.data, n, pairs, c0, nc, panel) }
}

/// # Safety
/// AVX-512 F/BW/VL must be available (the token); sizes as
/// [`decode_panel`] asserts.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn decode_panel_avx512(
    _: Avx512,
    data: &[u8],
    n: usize,
    pairs: Range<usize>,
    c0: usize,
    nc: usize,
    panel: &mut [u32],
) {
    let table = nibble_table();
    // SAFETY: 32 u16 = 64 bytes.
    let table = unsafe { _mm512_loadu_si512(table.as_ptr().cast()) };
    let nibbles = _mm512_set1_epi32(0x000F_000F);
    let mask: __mmask32 = if nc >= PANEL { !0 } else { (1u32 << nc) - 1 };
    let p0 = pairs.start;
    for p in pairs {
        // SAFETY: the masked load reads bytes p n + c0 .. + nc, inside
        // `data` (asserted by the caller); the stores write 32 dwords at
        // (p - p0) * 32 < panel.len().
        unsafe {
            let v = _mm256_maskz_loadu_epi8(mask, data.as_ptr().add(p * n + c0).cast());
            let halves = [_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v)];
            for (h, bytes) in halves.into_iter().enumerate() {
                // Byte b to the dword (b & 15) | (b >> 4) << 16: the low
                // nibble (input 2p) in the low half, as the tile unit pairs.
                let d = _mm512_cvtepu8_epi32(bytes);
                let d = _mm512_and_si512(_mm512_or_si512(d, _mm512_slli_epi32::<12>(d)), nibbles);
                let w = _mm512_permutexvar_epi16(d, table);
                _mm512_storeu_si512(panel.as_mut_ptr().add((p - p0) * PANEL + h * T).cast(), w);
            }
        }
    }
}
