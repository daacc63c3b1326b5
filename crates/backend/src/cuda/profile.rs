//! Where GPU time goes, op by op (`FERRITE_PROFILE=1`): a pair of timing
//! events around every backend op. The device has no profiler installed, and
//! this needs none; it slows the host a little but times the GPU exactly.
//! `busy` is the sum of op times, `timeline` the span from the first op's
//! start to the last one's end: the difference is the GPU idling between
//! ops, waiting for launches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{sys, CudaEvent, CudaStream};

/// (op, start, end, host seconds spent issuing it)
type Pending = Vec<(&'static str, CudaEvent, CudaEvent, f64)>;

static EVENTS: OnceLock<Mutex<Pending>> = OnceLock::new();

/// Whether profiling was asked for.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(ferrite_core::env::profiling)
}

/// A span name made at run time (an op and its shape), kept for the run:
/// each distinct name is allocated once.
pub fn intern(name: String) -> &'static str {
    static NAMES: Mutex<BTreeMap<String, &'static str>> = Mutex::new(BTreeMap::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.get(&name) {
        return n;
    }
    let n: &'static str = Box::leak(name.clone().into_boxed_str());
    names.insert(name, n);
    n
}

/// Whether only whole passes are timed (`FERRITE_PROFILE=phases`).
fn passes_only() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| ferrite_core::env::profiling_phases() && !enabled())
}

/// A span around a whole pass (an encoder batch), timed when only passes are
/// (with every op timed, it would count their time twice).
pub fn pass_span(stream: &Arc<CudaStream>, name: &'static str) -> Option<Span> {
    if !passes_only() {
        return None;
    }
    Some(Span { name, start: Some(recorded(stream)?), stream: stream.clone(), host: std::time::Instant::now() })
}

/// Times everything queued on `stream` between now and its drop.
pub struct Span {
    name: &'static str,
    start: Option<CudaEvent>,
    stream: Arc<CudaStream>,
    host: std::time::Instant,
}

fn recorded(stream: &Arc<CudaStream>) -> Option<CudaEvent> {
    let e = stream.context().new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).ok()?;
    e.record(stream).ok()?;
    Some(e)
}

/// A span named `name` when profiling, else nothing.
pub fn span(stream: &Arc<CudaStream>, name: &'static str) -> Option<Span> {
    if !enabled() {
        return None;
    }
    Some(Span { name, start: Some(recorded(stream)?), stream: stream.clone(), host: std::time::Instant::now() })
}

impl Drop for Span {
    fn drop(&mut self) {
        let host = self.host.elapsed().as_secs_f64();
        if let (Some(start), Some(end)) = (self.start.take(), recorded(&self.stream)) {
            let mut events = EVENTS.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner());
            events.push((self.name, start, end, host));
        }
    }
}

/// Time per op since the last call.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub ops: BTreeMap<&'static str, OpTime>,
    pub timeline_ms: f64,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct OpTime {
    pub calls: usize,
    /// Between the op's start and end events on the GPU.
    pub gpu_ms: f64,
    /// Issuing it on the host (the events' own cost included).
    pub host_ms: f64,
}

impl Profile {
    pub fn merge(&mut self, other: &Profile) {
        for (op, t) in &other.ops {
            let e = self.ops.entry(op).or_default();
            e.calls += t.calls;
            e.gpu_ms += t.gpu_ms;
            e.host_ms += t.host_ms;
        }
        self.timeline_ms += other.timeline_ms;
    }

    pub fn busy_ms(&self) -> f64 {
        self.ops.values().map(|v| v.gpu_ms).sum()
    }

    /// A table, largest share first.
    pub fn table(&self) -> String {
        let busy = self.busy_ms();
        let mut rows: Vec<_> = self.ops.iter().collect();
        rows.sort_by(|a, b| b.1.gpu_ms.total_cmp(&a.1.gpu_ms));
        let mut out = format!(
            "GPU timeline {:.2} ms, busy {:.2} ms ({:.1}%)\n| op | calls | GPU ms | share of busy | host ms |\n|---|---|---|---|---|\n",
            self.timeline_ms,
            busy,
            100.0 * busy / self.timeline_ms.max(1e-9)
        );
        for (op, t) in rows {
            let share = 100.0 * t.gpu_ms / busy.max(1e-9);
            out += &format!("| {op} | {} | {:.3} | {share:.1}% | {:.3} |\n", t.calls, t.gpu_ms, t.host_ms);
        }
        out
    }
}

/// Collects the spans recorded so far (waiting for them to finish).
pub fn take() -> Option<Profile> {
    if !enabled() && !passes_only() {
        return None;
    }
    let events = std::mem::take(&mut *EVENTS.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner()));
    let mut p = Profile::default();
    if let (Some(first), Some(last)) = (events.first(), events.last()) {
        last.2.synchronize().ok()?;
        p.timeline_ms = first.1.elapsed_ms(&last.2).ok()? as f64;
    }
    for (name, start, end, host) in &events {
        let e = p.ops.entry(*name).or_default();
        e.calls += 1;
        e.gpu_ms += start.elapsed_ms(end).ok()? as f64;
        e.host_ms += host * 1e3;
    }
    Some(p)
}
