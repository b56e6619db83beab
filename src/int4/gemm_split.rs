//! How the batched GEMMs on AVX2 and the scalar level (the float32 panel
//! GEMM of [`super::gemm`], which the FP8 linears run too, and the
//! int8-activation GEMM of `super::a8`) cut one call into tasks: whole
//! panels of output columns times blocks of batch rows, chosen from the
//! shape alone.
//!
//! Why many tasks: the fork-join (`crate::par`) hands tasks out one at a
//! time, so a call ends when its last task does. With two threads and six
//! one-panel tasks (SmolLM2's 576 -> 192 projection), a helper that starts
//! late or is descheduled leaves the other thread four of them; with
//! [`MIN_TASKS`] tasks the threads end within a sixteenth of the call of
//! each other. Why not more: every task decodes its own weight tiles, so a
//! batch split into `r` blocks decodes each weight `r` times; a block keeps
//! at least [`MIN_TASK_ROWS`] rows, over which one decode is a few percent
//! of the FMAs it feeds. Narrowing the columns to one panel per task costs
//! no extra decode at all (every weight still belongs to one tile).
//!
//! The grid never depends on the thread count: which thread runs a task
//! does not change what it computes, and every output is summed in the same
//! order by one task, so results are the same bits on any number of threads.

/// Tasks a call is cut into where its shape allows.
pub(crate) const MIN_TASKS: usize = 16;
/// Fewest batch rows a task holds when the batch is split (a batch of fewer
/// than twice this is never split).
pub(crate) const MIN_TASK_ROWS: usize = 96;

/// The tasks of one call: `col_tasks` column ranges of `cols` columns (the
/// last one shorter) times `row_tasks` batch blocks of `rows` rows (the last
/// one shorter); task `t` is column range `t % col_tasks` of block
/// `t / col_tasks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TaskGrid {
    /// Output columns per task (a multiple of the panel width).
    pub cols: usize,
    /// Batch rows per task (a multiple of the micro-kernel's height, or the
    /// whole batch).
    pub rows: usize,
    /// Column ranges.
    pub col_tasks: usize,
    /// Batch blocks.
    pub row_tasks: usize,
}

impl TaskGrid {
    /// Every task.
    pub(crate) fn tasks(&self) -> usize {
        self.col_tasks * self.row_tasks
    }
}

/// The grid for `n` output columns and `batch` rows: columns in tiles of
/// `widest` (a multiple of `panel`, the width the format decodes at a time)
/// where that gives [`MIN_TASKS`] tiles, one panel per task otherwise; then
/// the batch split into blocks (whole multiples of `mr` rows, at least
/// [`MIN_TASK_ROWS`]) until there are [`MIN_TASKS`] tasks.
pub(crate) fn task_grid(
    n: usize,
    batch: usize,
    panel: usize,
    widest: usize,
    mr: usize,
) -> TaskGrid {
    assert!(panel > 0 && widest >= panel && widest.is_multiple_of(panel) && mr > 0);
    let cols = if n.div_ceil(widest) >= MIN_TASKS {
        widest
    } else {
        panel
    };
    let col_tasks = n.div_ceil(cols).max(1);
    let wanted = MIN_TASKS.div_ceil(col_tasks);
    let blocks = wanted.min(batch / MIN_TASK_ROWS).max(1);
    let rows = batch
        .div_ceil(blocks)
        .next_multiple_of(mr)
        .min(batch)
        .max(1);
    TaskGrid {
        cols,
        rows,
        col_tasks,
        row_tasks: batch.div_ceil(rows).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_layers_split_the_batch_and_wide_ones_keep_their_tiles() {
        // SmolLM2's 576 -> 192: six panels; the batch is split from 192 rows.
        let g = task_grid(192, 64, 32, 192, 3);
        assert_eq!((g.cols, g.col_tasks, g.row_tasks, g.rows), (32, 6, 1, 64));
        let g = task_grid(192, 512, 32, 192, 3);
        assert_eq!((g.cols, g.col_tasks, g.row_tasks, g.rows), (32, 6, 3, 171));
        // 576 -> 576: eighteen panels, no batch split.
        let g = task_grid(576, 512, 32, 192, 3);
        assert_eq!((g.cols, g.col_tasks, g.row_tasks), (32, 18, 1));
        // 576 -> 49152: 192 tiles as tuned.
        let g = task_grid(49152, 512, 32, 256, 3);
        assert_eq!((g.cols, g.col_tasks, g.row_tasks), (256, 192, 1));
    }

    #[test]
    fn the_tasks_cover_every_row_and_column_once() {
        for n in [1, 31, 32, 45, 192, 200, 576, 1000, 4100] {
            for batch in [1, 8, 95, 191, 192, 193, 301, 512, 1023] {
                for (panel, widest, mr) in [(32, 192, 3), (32, 256, 4), (32, 32, 3)] {
                    let g = task_grid(n, batch, panel, widest, mr);
                    let what = format!("n {n} batch {batch} {g:?}");
                    assert!(g.cols.is_multiple_of(panel), "{what}");
                    assert!(g.rows == batch || g.rows.is_multiple_of(mr), "{what}");
                    assert!(g.row_tasks == 1 || g.rows >= MIN_TASK_ROWS - mr, "{what}");
                    // The ranges tile 0..n and 0..batch with no empty task.
                    assert!(
                        g.col_tasks * g.cols >= n && (g.col_tasks - 1) * g.cols < n,
                        "{what}"
                    );
                    assert!(
                        g.row_tasks * g.rows >= batch && (g.row_tasks - 1) * g.rows < batch,
                        "{what}"
                    );
                }
            }
        }
    }
}
