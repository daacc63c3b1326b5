//! Summary statistics: mean, median and percentiles with linear
//! interpolation between closest ranks (numpy's default, which `vllm bench
//! serve` uses).

use serde_json::{json, Value};

/// The `p`th percentile (0..=100) of `sorted` (ascending, no NaN); `None` when
/// empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = p.clamp(0.0, 100.0) / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// Mean, median, p90 and p99 of one metric, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean: Option<f64>,
    pub median: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

impl Summary {
    /// From values in seconds.
    pub fn of_seconds(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().map(|s| s * 1000.0).filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let mean = (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        Summary {
            count: v.len(),
            mean,
            median: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
        }
    }

    /// Adds `mean_NAME_ms`, `median_NAME_ms`, `p90_NAME_ms`, `p99_NAME_ms`
    /// (null when there were no samples), the key names `vllm bench serve`
    /// uses.
    pub fn add_json(&self, obj: &mut serde_json::Map<String, Value>, name: &str) {
        for (stat, v) in [("mean", self.mean), ("median", self.median), ("p90", self.p90), ("p99", self.p99)] {
            obj.insert(format!("{stat}_{name}_ms"), json!(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn percentile_matches_numpy_linear() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // numpy.percentile([1,2,3,4], [0,50,90,99,100]) = 1, 2.5, 3.7, 3.97, 4
        assert!(close(percentile(&v, 0.0), 1.0));
        assert!(close(percentile(&v, 50.0), 2.5));
        assert!(close(percentile(&v, 90.0), 3.7));
        assert!(close(percentile(&v, 99.0), 3.97));
        assert!(close(percentile(&v, 100.0), 4.0));
        let w: Vec<f64> = (1..=100).map(f64::from).collect();
        // numpy.percentile(range(1,101), 90) = 90.1; 99 -> 99.01
        assert!(close(percentile(&w, 90.0), 90.1));
        assert!(close(percentile(&w, 99.0), 99.01));
        assert!(close(percentile(&w, 50.0), 50.5));
    }

    #[test]
    fn percentile_edge_cases() {
        assert_eq!(percentile(&[], 50.0), None);
        assert!(close(percentile(&[7.0], 0.0), 7.0));
        assert!(close(percentile(&[7.0], 99.0), 7.0));
        assert!(close(percentile(&[1.0, 3.0], 150.0), 3.0));
        assert!(close(percentile(&[1.0, 3.0], -5.0), 1.0));
    }

    #[test]
    fn summary_sorts_converts_and_handles_empty() {
        let s = Summary::of_seconds(&[0.003, 0.001, 0.002]);
        assert_eq!(s.count, 3);
        assert!(close(s.mean, 2.0));
        assert!(close(s.median, 2.0));
        assert!(close(s.p90, 2.8));
        let e = Summary::of_seconds(&[]);
        assert_eq!(e, Summary::default());
        let mut m = serde_json::Map::new();
        e.add_json(&mut m, "ttft");
        assert_eq!(m["p99_ttft_ms"], Value::Null);
        s.add_json(&mut m, "itl");
        assert!((m["mean_itl_ms"].as_f64().unwrap() - 2.0).abs() < 1e-9);
    }
}
