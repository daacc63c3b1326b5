//! Prometheus text exposition, hand-written: the server's own counters and
//! latency histograms (measured from event timing) plus the engine's gauges,
//! and the embedding engine's counters.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ferrite_engine::embed::EmbedMetrics;
use ferrite_engine::{FinishReason, Metrics};

const TTFT_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const ITL_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
const REASONS: [FinishReason; 4] =
    [FinishReason::Stop, FinishReason::Length, FinishReason::Cancelled, FinishReason::Error];

/// A fixed-bucket histogram; counts are per bucket (made cumulative when rendered).
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, help, "histogram");
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.buckets) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// Counters the server keeps itself.
pub struct ServerMetrics {
    requests: AtomicU64,
    finished: [AtomicU64; 4],
    pub ttft: Histogram,
    pub itl: Histogram,
    http: Mutex<BTreeMap<u16, u64>>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        ServerMetrics {
            requests: AtomicU64::new(0),
            finished: Default::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            http: Mutex::new(BTreeMap::new()),
        }
    }
}

impl ServerMetrics {
    /// One generation request accepted by the engine (each of `n` counts).
    pub fn request_started(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub fn request_finished(&self, reason: FinishReason) {
        let i = REASONS.iter().position(|&r| r == reason).unwrap_or(3);
        self.finished[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn http_response(&self, status: u16) {
        if let Ok(mut m) = self.http.lock() {
            *m.entry(status).or_insert(0) += 1;
        }
    }

    /// The whole exposition: server counters, then the engine snapshot `e`
    /// and the embedding engine's `embed` (zeros for the kind not served).
    pub fn render(&self, e: &Metrics, embed: &EmbedMetrics) -> String {
        let mut out = String::new();
        counter(
            &mut out,
            "ferrite_requests_total",
            "Generation requests accepted.",
            self.requests.load(Ordering::Relaxed),
        );
        header(&mut out, "ferrite_requests_finished_total", "Generation requests finished, by reason.", "counter");
        for (r, c) in REASONS.iter().zip(&self.finished) {
            let _ = writeln!(
                out,
                "ferrite_requests_finished_total{{finish_reason=\"{}\"}} {}",
                r.as_str(),
                c.load(Ordering::Relaxed)
            );
        }
        counter(&mut out, "ferrite_prompt_tokens_total", "Prompt tokens processed.", e.prompt_tokens);
        counter(&mut out, "ferrite_generation_tokens_total", "Tokens generated.", e.generation_tokens);
        self.ttft.render(&mut out, "ferrite_time_to_first_token_seconds", "Time from submission to the first token.");
        self.itl.render(
            &mut out,
            "ferrite_inter_token_latency_seconds",
            "Time between consecutive tokens of a request.",
        );
        gauge(&mut out, "ferrite_num_requests_running", "Requests being processed.", e.running as f64);
        gauge(&mut out, "ferrite_num_requests_waiting", "Requests waiting for admission.", e.waiting as f64);
        gauge(
            &mut out,
            "ferrite_kv_cache_blocks_used",
            "KV cache blocks held by live sequences.",
            e.kv_blocks_used as f64,
        );
        gauge(&mut out, "ferrite_kv_cache_blocks_total", "KV cache blocks in total.", e.kv_blocks_total as f64);
        gauge(
            &mut out,
            "ferrite_kv_cache_usage_ratio",
            "Used / total KV cache blocks.",
            ratio(e.kv_blocks_used as u64, e.kv_blocks_total as u64),
        );
        counter(
            &mut out,
            "ferrite_prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            e.prefix_query_tokens,
        );
        counter(
            &mut out,
            "ferrite_prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache.",
            e.prefix_hit_tokens,
        );
        gauge(
            &mut out,
            "ferrite_prefix_cache_hit_rate",
            "Prefix cache hits / queries, in tokens.",
            ratio(e.prefix_hit_tokens, e.prefix_query_tokens),
        );
        counter(&mut out, "ferrite_preemptions_total", "Sequences preempted for lack of KV blocks.", e.preemptions);
        counter(&mut out, "ferrite_engine_steps_total", "Forward passes run.", e.steps);
        render_embed(&mut out, embed);
        header(&mut out, "ferrite_http_requests_total", "HTTP responses, by status code.", "counter");
        if let Ok(m) = self.http.lock() {
            for (status, n) in m.iter() {
                let _ = writeln!(out, "ferrite_http_requests_total{{status=\"{status}\"}} {n}");
            }
        }
        out
    }
}

fn render_embed(out: &mut String, m: &EmbedMetrics) {
    counter(out, "ferrite_embedding_requests_total", "Embedding requests answered.", m.requests);
    counter(out, "ferrite_embedding_inputs_total", "Inputs embedded.", m.inputs);
    counter(out, "ferrite_embedding_tokens_total", "Tokens embedded.", m.tokens);
    counter(out, "ferrite_embedding_batches_total", "Embedding forward passes run.", m.batches);
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {v}");
}

fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {v}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_histograms_cumulatively() {
        let m = ServerMetrics::default();
        m.ttft.observe(Duration::from_millis(20));
        m.ttft.observe(Duration::from_millis(200));
        m.ttft.observe(Duration::from_secs(100));
        m.request_started();
        m.request_finished(FinishReason::Length);
        m.http_response(200);
        let embed = EmbedMetrics { requests: 3, tokens: 70, ..Default::default() };
        let text = m.render(&Metrics { kv_blocks_total: 10, kv_blocks_used: 5, ..Default::default() }, &embed);
        assert!(text.contains("ferrite_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), "{text}");
        assert!(text.contains("ferrite_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n"));
        assert!(text.contains("ferrite_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("ferrite_time_to_first_token_seconds_count 3\n"));
        assert!(text.contains("ferrite_requests_total 1\n"));
        assert!(text.contains("ferrite_requests_finished_total{finish_reason=\"length\"} 1\n"));
        assert!(text.contains("ferrite_kv_cache_usage_ratio 0.5\n"));
        assert!(text.contains("ferrite_prefix_cache_hit_rate 0\n"));
        assert!(text.contains("ferrite_http_requests_total{status=\"200\"} 1\n"));
        assert!(text.contains("# TYPE ferrite_inter_token_latency_seconds histogram\n"));
        assert!(text.contains("ferrite_embedding_requests_total 3\n"));
        assert!(text.contains("ferrite_embedding_tokens_total 70\n"));
        assert!(text.contains("# TYPE ferrite_embedding_batches_total counter\n"));
    }
}
