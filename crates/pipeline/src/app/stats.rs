//! Per-frame timing samples in a buffer allocated once, and their percentiles.

/// Samples in nanoseconds; capacity fixed at construction, never grows.
#[derive(Debug, Clone)]
pub struct Samples {
    values: Vec<u64>,
    capacity: usize,
}

/// Summary of a set of samples, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Median (nearest rank).
    pub p50: u64,
    /// 99th percentile (nearest rank).
    pub p99: u64,
    /// Largest sample.
    pub max: u64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Samples {
    /// Room for exactly `capacity` samples.
    pub fn with_capacity(capacity: usize) -> Self {
        Samples {
            values: Vec::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds a sample; fails instead of growing when full.
    pub fn push(&mut self, ns: u64) -> Result<(), String> {
        if self.values.len() == self.capacity {
            return Err(format!("sample buffer full ({} samples)", self.capacity));
        }
        self.values.push(ns);
        Ok(())
    }

    /// Sorts the samples in place and summarises them; `None` when empty.
    pub fn summary(&mut self) -> Option<Summary> {
        if self.values.is_empty() {
            return None;
        }
        self.values.sort_unstable();
        let sum: u128 = self.values.iter().map(|&v| u128::from(v)).sum();
        Some(Summary {
            count: self.values.len(),
            p50: nearest_rank(&self.values, 50.0),
            p99: nearest_rank(&self.values, 99.0),
            max: self.values[self.values.len() - 1],
            mean: sum as f64 / self.values.len() as f64,
        })
    }
}

/// The nearest-rank percentile `p` (0 < p <= 100) of non-empty sorted data:
/// the smallest value with at least p% of the samples at or below it.
pub fn nearest_rank(sorted: &[u64], p: f64) -> u64 {
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_1_to_100() {
        let mut s = Samples::with_capacity(100);
        // Pushed out of order; summary sorts.
        for v in (1..=100).rev() {
            s.push(v).unwrap();
        }
        let sum = s.summary().unwrap();
        assert_eq!(sum.count, 100);
        assert_eq!(sum.p50, 50);
        assert_eq!(sum.p99, 99);
        assert_eq!(sum.max, 100);
        assert!((sum.mean - 50.5).abs() < 1e-9);
    }

    #[test]
    fn small_sets_and_outliers() {
        assert_eq!(nearest_rank(&[7], 50.0), 7);
        assert_eq!(nearest_rank(&[7], 99.0), 7);
        assert_eq!(nearest_rank(&[1, 2, 3], 50.0), 2);
        // One slow frame out of ten is the p99 and the max, not the median.
        let mut data = vec![10u64; 9];
        data.push(1000);
        assert_eq!(nearest_rank(&data, 50.0), 10);
        assert_eq!(nearest_rank(&data, 99.0), 1000);
    }

    #[test]
    fn buffer_does_not_grow() {
        let mut s = Samples::with_capacity(2);
        s.push(1).unwrap();
        s.push(2).unwrap();
        assert!(s.push(3).is_err());
        assert_eq!(s.summary().unwrap().count, 2);
        assert!(Samples::with_capacity(4).summary().is_none());
    }
}
