//! Where GPU time goes, op by op (`FERRITE_PROFILE=1`): a pair of timing
//! events around every backend op. The device has no profiler installed, and
//! this needs none; it slows the host a little but times the GPU exactly.
//! `busy` is the sum of op times, `timeline` the span from the first op's
//! start to the last one's end: the difference is the GPU idling between
//! ops, waiting for launches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{sys, CudaEvent, CudaStream};

type Pending = Vec<(&'static str, CudaEvent, CudaEvent)>;

static EVENTS: OnceLock<Mutex<Pending>> = OnceLock::new();

/// Whether profiling was asked for.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FERRITE_PROFILE").is_some_and(|v| v != "0"))
}

/// Times everything queued on `stream` between now and its drop.
pub struct Span {
    name: &'static str,
    start: Option<CudaEvent>,
    stream: Arc<CudaStream>,
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
    Some(Span { name, start: Some(recorded(stream)?), stream: stream.clone() })
}

impl Drop for Span {
    fn drop(&mut self) {
        if let (Some(start), Some(end)) = (self.start.take(), recorded(&self.stream)) {
            EVENTS.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner()).push((self.name, start, end));
        }
    }
}

/// GPU milliseconds per op since the last call.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// op -> (calls, milliseconds)
    pub ops: BTreeMap<&'static str, (usize, f64)>,
    pub timeline_ms: f64,
}

impl Profile {
    pub fn merge(&mut self, other: &Profile) {
        for (op, (n, ms)) in &other.ops {
            let e = self.ops.entry(op).or_default();
            e.0 += n;
            e.1 += ms;
        }
        self.timeline_ms += other.timeline_ms;
    }

    pub fn busy_ms(&self) -> f64 {
        self.ops.values().map(|v| v.1).sum()
    }

    /// A table, largest share first.
    pub fn table(&self) -> String {
        let busy = self.busy_ms();
        let mut rows: Vec<_> = self.ops.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let mut out = format!(
            "GPU timeline {:.2} ms, busy {:.2} ms ({:.1}%)\n| op | calls | ms | share of busy |\n|---|---|---|---|\n",
            self.timeline_ms,
            busy,
            100.0 * busy / self.timeline_ms.max(1e-9)
        );
        for (op, (n, ms)) in rows {
            out += &format!("| {op} | {n} | {ms:.3} | {:.1}% |\n", 100.0 * ms / busy.max(1e-9));
        }
        out
    }
}

/// Collects the spans recorded so far (waiting for them to finish).
pub fn take() -> Option<Profile> {
    if !enabled() {
        return None;
    }
    let events = std::mem::take(&mut *EVENTS.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner()));
    let mut p = Profile::default();
    if let (Some(first), Some(last)) = (events.first(), events.last()) {
        last.2.synchronize().ok()?;
        p.timeline_ms = first.1.elapsed_ms(&last.2).ok()? as f64;
    }
    for (name, start, end) in &events {
        let ms = start.elapsed_ms(end).ok()? as f64;
        let e = p.ops.entry(*name).or_default();
        e.0 += 1;
        e.1 += ms;
    }
    Some(p)
}
