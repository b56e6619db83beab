//! Transparent huge pages for large weight buffers (Linux).
//!
//! Why: a batch-1 matvec streams its whole weight from DRAM once per call.
//! On 4 KiB pages a 28 MB INT4 matrix (4096x11008 g32) is about 6900
//! page-table walks per call, on 2 MiB pages 14. NumPy already asks for
//! huge pages on its own large arrays (so the float32 baseline of
//! `benches/bench_decode.py` and the read probe of `benches/_bandwidth.py`
//! run on them), while a `Vec` the Rust layer allocates gets 4 KiB pages
//! unless the system's THP mode is `always`; most distributions default to
//! `madvise`. Measured on the 2-vCPU Zen 3 host (docs/benchmarks.md, "A
//! decode step on Zen 3, call by call"): the seven INT4 g32 matrices of a
//! decode layer on huge pages took 0.95-0.96 of the one-thread CPU time of
//! the same matrices on 4 KiB pages, in one process, alternating.
//!
//! The same holds for every weight a batch-1 forward streams: INT4's codes
//! and scales (`crate::int4`), the per-tensor FP8 layer's and `Fp8Weight`'s
//! E4M3 codes (`crate::linear::fp8_linear`, `crate::format::fp8_e4m3`) and
//! the packed GGUF blocks (`crate::format::gguf_blocks`) each advise their
//! buffer when built.
//!
//! [`advise`] asks the kernel for huge pages on the whole 2 MiB extents of a
//! buffer (never on memory outside it, so no other allocation changes) and
//! collapses the already written pages into them (`MADV_COLLAPSE`, Linux
//! 6.1 and later: a one-time copy at construction). Both requests are
//! advice: a kernel that refuses (older, THP `never`, no free huge pages)
//! leaves the buffer as it was, and the bytes never change either way.

/// Buffers smaller than this are left alone: fewer than two whole 2 MiB
/// extents, and small weights stay in the caches anyway.
pub(crate) const MIN_BYTES: usize = 4 << 20;

/// The huge page size this module aligns to (x86-64 and most aarch64
/// kernels; on a kernel with another size the advice covers fewer bytes,
/// and is still only advice).
const HUGE: usize = 2 << 20;

/// Ask for transparent huge pages on `buf`'s whole 2 MiB extents and move
/// its pages there now (a no-op off Linux). Returns the bytes of those whole
/// extents (0 for a small buffer); whether the kernel complied is not
/// reported, because nothing depends on it.
pub(crate) fn advise<T: Copy>(buf: &[T]) -> usize {
    let len = std::mem::size_of_val(buf);
    if len < MIN_BYTES {
        return 0;
    }
    let start = buf.as_ptr() as usize;
    let lo = start.next_multiple_of(HUGE);
    let hi = (start + len) / HUGE * HUGE;
    if hi <= lo {
        return 0;
    }
    advise_range(lo, hi - lo);
    hi - lo
}

#[cfg(target_os = "linux")]
fn advise_range(addr: usize, len: usize) {
    // Linux's values (include/uapi/asm-generic/mman-common.h).
    const MADV_HUGEPAGE: i32 = 14;
    const MADV_COLLAPSE: i32 = 25;
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    for advice in [MADV_HUGEPAGE, MADV_COLLAPSE] {
        // SAFETY: `addr .. addr + len` lies inside one live allocation the
        // caller borrows (whole 2 MiB extents of it, so page-aligned, as
        // madvise requires); both advices keep the memory's contents and
        // mapping (a collapse copies the pages into a huge page and remaps
        // it atomically), so no byte any thread reads changes. The return
        // value is ignored on purpose: a refusal leaves the pages as they
        // were.
        unsafe {
            madvise(addr as *mut std::ffi::c_void, len, advice);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_range(_addr: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_buffers_are_left_alone() {
        assert_eq!(advise::<u8>(&[]), 0);
        assert_eq!(advise(&vec![1u8; MIN_BYTES - 1]), 0);
        assert_eq!(advise(&vec![1.0f32; MIN_BYTES / 4 - 1]), 0);
    }

    #[test]
    fn advice_covers_only_whole_extents_inside_and_keeps_the_bytes() {
        // 9 MiB: however the allocator aligns it, it holds 3 or 4 whole
        // 2 MiB extents, all inside the buffer.
        let data: Vec<u8> = (0..9usize << 20)
            .map(|i| (i * 7 + i / 4093) as u8)
            .collect();
        let before = data.clone();
        let advised = advise(&data);
        assert!(advised.is_multiple_of(HUGE));
        assert!((6 << 20..=8 << 20).contains(&advised), "{advised}");
        assert!(data == before);
        // The f32 form counts bytes, not elements.
        let scales = vec![0.5f32; 3 << 20];
        let advised = advise(&scales);
        assert!(advised <= scales.len() * 4 && advised.is_multiple_of(HUGE));
        assert!(scales.iter().all(|&s| s == 0.5));
    }
}
