//! Per-frame timing figures: the one place the pipeline computes
//! percentiles (an HDR histogram, so memory stays the same however many
//! frames run).

use hdrhistogram::Histogram;

/// The largest time a histogram tells apart, in nanoseconds (one minute);
/// longer samples count as one minute in the percentiles (the maximum and
/// the mean stay exact).
pub const HIGHEST_NS: u64 = 60_000_000_000;

/// Significant decimal digits the percentiles keep (relative error below
/// 0.1%; values below 2048 ns are exact).
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// Samples in nanoseconds: a histogram of fixed size, plus the exact sum and
/// maximum.
#[derive(Debug, Clone)]
pub struct Samples {
    hist: Histogram<u64>,
    sum: u128,
    max: u64,
}

/// Summary of a set of samples, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples; 0 where the run did not measure this figure (then
    /// every other field is 0).
    pub count: u64,
    /// Median (the histogram's value at quantile 0.5).
    pub p50: u64,
    /// 99th percentile (the histogram's value at quantile 0.99).
    pub p99: u64,
    /// Largest sample (exact).
    pub max: u64,
    /// Arithmetic mean (exact).
    pub mean: f64,
}

impl Summary {
    /// A figure the run did not measure.
    pub const NOT_MEASURED: Summary = Summary {
        count: 0,
        p50: 0,
        p99: 0,
        max: 0,
        mean: 0.0,
    };
}

impl Samples {
    /// An empty set (about 200 KiB, whatever the number of samples).
    pub fn new() -> Result<Self, String> {
        let hist = Histogram::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS)
            .map_err(|e| format!("timing histogram: {e:?}"))?;
        Ok(Samples {
            hist,
            sum: 0,
            max: 0,
        })
    }

    /// Adds a sample (one above [`HIGHEST_NS`] counts as that in the
    /// percentiles).
    pub fn push(&mut self, ns: u64) {
        self.hist.saturating_record(ns);
        self.sum += u128::from(ns);
        self.max = self.max.max(ns);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The summary; `None` when there are no samples.
    pub fn summary(&self) -> Option<Summary> {
        let count = self.hist.len();
        if count == 0 {
            return None;
        }
        // The histogram reports a bucket's highest value; never above the
        // exact maximum.
        let at = |q: f64| self.hist.value_at_quantile(q).min(self.max);
        Some(Summary {
            count,
            p50: at(0.50),
            p99: at(0.99),
            max: self.max,
            mean: self.sum as f64 / count as f64,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_1_to_100() {
        let mut s = Samples::new().unwrap();
        for v in (1..=100).rev() {
            s.push(v);
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
        let of = |data: &[u64]| {
            let mut s = Samples::new().unwrap();
            data.iter().for_each(|&v| s.push(v));
            s.summary().unwrap()
        };
        assert_eq!((of(&[7]).p50, of(&[7]).p99), (7, 7));
        assert_eq!(of(&[1, 2, 3]).p50, 2);
        // One slow frame out of ten is the p99 and the max, not the median.
        let mut data = vec![10u64; 9];
        data.push(1000);
        let s = of(&data);
        assert_eq!((s.p50, s.p99, s.max), (10, 1000, 1000));
        assert!(Samples::new().unwrap().summary().is_none());
    }

    #[test]
    fn large_values_within_a_thousandth_and_the_maximum_exact() {
        let mut s = Samples::new().unwrap();
        for i in 0..200_000u64 {
            s.push(1_000_000 + i);
        }
        s.push(HIGHEST_NS * 10);
        let sum = s.summary().unwrap();
        assert_eq!(sum.count, 200_001);
        assert_eq!(sum.max, HIGHEST_NS * 10, "the maximum is exact");
        let want = 1_100_000f64;
        assert!(((sum.p50 as f64) - want).abs() / want < 1e-3, "{sum:?}");
    }
}
