//! Statistics over repeated measurements, and their formatting.

use std::time::Duration;

/// Median, minimum and maximum of `values` (all 0 when empty).
pub(crate) fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match (sorted.first(), sorted.last()) {
        (Some(min), Some(max)) => (percentile_of_sorted(&sorted, 50.0), *min, *max),
        _ => (0.0, 0.0, 0.0),
    }
}

/// The `p`th percentile (nearest rank) of sorted values.
pub(crate) fn percentile_of_sorted<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `median (min–max)` with `decimals` digits.
pub(crate) fn median_range(values: &[f64], decimals: usize) -> String {
    let (median, min, max) = spread(values);
    if values.len() < 2 {
        return format!("{median:.decimals$}");
    }
    format!("{median:.decimals$} ({min:.decimals$}–{max:.decimals$})")
}

/// Seconds with two decimals.
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// Milliseconds with one decimal, from microseconds.
pub(crate) fn ms_from_us(us: u64) -> String {
    format!("{:.1}", us as f64 / 1000.0)
}

/// Mebibytes with one decimal.
pub(crate) fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1024.0 / 1024.0)
}
