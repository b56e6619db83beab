//! The row layout of a sharded parameter's state (`RowLayout`): a step on
//! any cut of the rows into shards gives the bits of one engine over the
//! whole parameter, state included, at ~1.03 bytes per element.

use super::state::{RowLayout, Scales, VScales};
use super::{
    Adam4bitOptimizerConfig, AdamW4bit, AdvancedQuantizationConfig, Optimizer, ParamMut,
    ParamState, QuantizationMethod, StatefulOptimizer,
};
use crate::error::QuantError;
use crate::testutil::xorshift_f32;

fn engine(q: AdvancedQuantizationConfig, first_row: usize, global_rows: usize) -> AdamW4bit {
    let o = Adam4bitOptimizerConfig {
        learning_rate: 1e-2,
        weight_decay: 0.01,
        ..Default::default()
    };
    let mut opt = AdamW4bit::with_quantization_config(o, q);
    let layout = RowLayout {
        first_row: first_row as u64,
        global_rows: global_rows as u64,
    };
    opt.set_row_layout(Some(layout)).unwrap();
    opt
}

/// FSDP2's cut of `rows` rows over `world` ranks (`torch.chunk`: chunks of
/// `ceil(rows / world)`, the last ones shorter or empty).
fn cuts(rows: usize, world: usize) -> Vec<(usize, usize)> {
    let c = rows.div_ceil(world);
    (0..world)
        .map(|r| ((r * c).min(rows), ((r + 1) * c).min(rows)))
        .collect()
}

/// Three steps of the rows `lo..hi` of a `rows x row` parameter; returns
/// the weights and the state.
fn run_rows(
    q: AdvancedQuantizationConfig,
    (rows, row): (usize, usize),
    (lo, hi): (usize, usize),
) -> (Vec<f32>, ParamState) {
    let mut o = engine(q, lo, rows);
    let w_all = xorshift_f32(3, rows * row, 1.0);
    let mut w = w_all[lo * row..hi * row].to_vec();
    for s in 0..3u64 {
        let g_all = xorshift_f32(10 + s, rows * row, 0.1);
        let g = &g_all[lo * row..hi * row];
        let p = ParamMut {
            name: Some("w"),
            shape: &[hi - lo, row],
            data: &mut w,
        };
        o.update_param(p, g).unwrap();
        o.step();
    }
    (w, o.core.state().params["n:w"].clone())
}

fn concat_scales(parts: &[&Scales]) -> Scales {
    match parts[0] {
        Scales::F32(_) => Scales::F32(
            parts
                .iter()
                .flat_map(|s| match s {
                    Scales::F32(v) => v.clone(),
                    Scales::Double { .. } => unreachable!(),
                })
                .collect(),
        ),
        Scales::Double { .. } => {
            let (mut codes, mut groups) = (Vec::new(), Vec::new());
            for s in parts {
                if let Scales::Double {
                    codes: c,
                    groups: g,
                } = s
                {
                    codes.extend_from_slice(c);
                    groups.extend_from_slice(g);
                }
            }
            Scales::Double { codes, groups }
        }
    }
}

#[test]
fn any_cut_of_the_rows_gives_the_bits_of_the_whole() {
    // 300 blocks of 64 in a row: two groups per row, the second short.
    for (rows, row) in [(7usize, 64 * 300), (5, 128), (4, 768)] {
        for method in [QuantizationMethod::Nf4, QuantizationMethod::Int8] {
            let q = AdvancedQuantizationConfig {
                method,
                ..Default::default()
            };
            let (w1, s1) = run_rows(q, (rows, row), (0, rows));
            for world in [2usize, 3, 4] {
                let parts: Vec<_> = cuts(rows, world)
                    .into_iter()
                    .filter(|(lo, hi)| hi > lo)
                    .map(|c| run_rows(q, (rows, row), c))
                    .collect();
                let w: Vec<u32> = parts
                    .iter()
                    .flat_map(|p| &p.0)
                    .map(|x| x.to_bits())
                    .collect();
                let w_whole: Vec<u32> = w1.iter().map(|x| x.to_bits()).collect();
                assert_eq!(w, w_whole, "{rows}x{row} {method:?} world {world}");
                let m_codes: Vec<u8> = parts.iter().flat_map(|p| p.1.m_codes.clone()).collect();
                let v_codes: Vec<u8> = parts.iter().flat_map(|p| p.1.v_codes.clone()).collect();
                assert_eq!(m_codes, s1.m_codes);
                assert_eq!(v_codes, s1.v_codes);
                let ms: Vec<&Scales> = parts.iter().map(|p| &p.1.m_scales).collect();
                assert_eq!(concat_scales(&ms), s1.m_scales);
                let vs: Vec<&Scales> = parts
                    .iter()
                    .map(|p| match &p.1.v_scales {
                        VScales::Block(s) => s,
                        VScales::Rank1 { .. } => unreachable!(),
                    })
                    .collect();
                assert_eq!(VScales::Block(concat_scales(&vs)), s1.v_scales);
            }
        }
    }
}

#[test]
fn the_row_layout_double_quantizes_within_each_row() {
    // GPT-2's 768-wide rows: 12 blocks of 64, one 8-bit code per block and
    // one f32 maximum per row and moment: 1 + 2 * (12 + 4) / 768 bytes per
    // element.
    let q = AdvancedQuantizationConfig::default();
    let (_, st) = run_rows(q, (6, 768), (0, 6));
    match &st.m_scales {
        Scales::Double { codes, groups } => {
            assert_eq!(codes.len(), 6 * 12);
            assert_eq!(groups.len(), 6);
        }
        Scales::F32(_) => panic!("expected double-quantized scales"),
    }
    let per_elem = st.bytes() as f64 / (6.0 * 768.0);
    assert!(
        (per_elem - (1.0 + 2.0 * 16.0 / 768.0)).abs() < 1e-12,
        "{per_elem}"
    );
}

#[test]
fn bad_row_layouts_are_refused() {
    let q = AdvancedQuantizationConfig {
        rank1_normalization: true,
        ..Default::default()
    };
    let mut o = AdamW4bit::with_quantization_config(Adam4bitOptimizerConfig::default(), q);
    let layout = RowLayout {
        first_row: 0,
        global_rows: 4,
    };
    assert!(matches!(
        o.core.set_row_layout(Some(layout)),
        Err(QuantError::InvalidArgument(_))
    ));
    let bad_first = RowLayout {
        first_row: 4,
        global_rows: 4,
    };
    let mut o = engine(AdvancedQuantizationConfig::default(), 0, 4);
    assert!(o.core.set_row_layout(Some(bad_first)).is_err());
    let mut w = vec![0.5f32; 4 * 100];
    let g = vec![0.1f32; 4 * 100];
    for shape in [vec![400usize], vec![4, 100], vec![5, 80]] {
        let p = ParamMut {
            name: Some("w"),
            shape: &shape,
            data: &mut w,
        };
        let err = o.update_param(p, &g).unwrap_err();
        assert!(err.to_string().contains("row"), "{shape:?}: {err}");
    }
    assert!(o.core.state().params.is_empty());
    // A whole-optimizer file cannot hold a row-layout parameter.
    let mut w = vec![0.5f32; 2 * 64];
    let p = ParamMut {
        name: Some("w"),
        shape: &[2, 64],
        data: &mut w,
    };
    o.update_param(p, &[0.1; 128]).unwrap();
    assert!(matches!(o.state_dict(), Err(QuantError::InvalidState(_))));
}
