//! The decode graph's timeline on the GPU itself (`FERRITE_CUDA_TRACE=1`),
//! for finding where a step's time goes without a profiler: the kernels are
//! built with FERRITE_TRACE, and the first thread of each kernel records
//! (kernels/common.cuh, `pdl_wait`) when it arrived at its wait for the
//! kernel before, when it left it and which function waited. A kernel's time
//! on the step's critical path is from its release to the next kernel's;
//! its lead, how long it waited released by nothing but the kernel before
//! (a kernel that starts early can prefetch). Recording costs the first
//! thread an atomic, so steps run a little slower than untraced. With
//! `FERRITE_CUDA_TRACE=2` some kernels also record marks at their stages
//! (`trace_mark`), which split their spans here like releases.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaModule, CudaStream};

/// The modules whose records `take` reads (only while tracing).
static MODULES: Mutex<Vec<(Arc<CudaModule>, Arc<CudaStream>)>> = Mutex::new(Vec::new());

/// Records per module (TRACE_RECORDS in kernels/common.cuh).
const RECORDS: usize = 32768;

/// Spans longer than this are the host's gaps between steps, not a kernel's.
const GAP_NS: u64 = 1_000_000;

/// Keeps `module` for `take` when tracing.
pub fn watch(module: &Arc<CudaModule>, stream: &Arc<CudaStream>) {
    if ferrite_core::env::cuda_trace() {
        MODULES.lock().unwrap_or_else(|e| e.into_inner()).push((module.clone(), stream.clone()));
    }
}

struct Record {
    arrived: u64,
    left: u64,
    name: String,
}

/// Every module's records since the last call (their counters reset), and
/// how many older ones the rings lost.
fn drain() -> Option<(Vec<Record>, usize)> {
    let modules = MODULES.lock().unwrap_or_else(|e| e.into_inner());
    let (mut out, mut lost) = (Vec::new(), 0);
    for (m, s) in modules.iter() {
        let mut count = m.get_global("ferrite_trace_n", s).ok()?;
        let mut n = [0u8; 4];
        s.memcpy_dtoh(&count, &mut n).ok()?;
        let buf = m.get_global("ferrite_trace", s).ok()?;
        let mut bytes = vec![0u8; buf.len()];
        s.memcpy_dtoh(&buf, &mut bytes).ok()?;
        s.synchronize().ok()?;
        s.memcpy_htod(&[0u8; 4], &mut count).ok()?;
        let total = u32::from_le_bytes(n) as usize;
        let n = total.min(RECORDS);
        lost += total - n;
        let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap_or_default());
        for r in 0..n {
            let name: Vec<u8> = [word(4 * r + 2), word(4 * r + 3)]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .take_while(|&b| b != 0)
                .collect();
            let name = String::from_utf8_lossy(&name).into_owned();
            out.push(Record { arrived: word(4 * r), left: word(4 * r + 1), name });
        }
    }
    out.sort_by_key(|r| r.left);
    Some((out, lost))
}

/// The timeline recorded since the last call, as text: per waiting function
/// its calls, critical-path time and lead, then one step (the kernels
/// between the last two samplings) in order. `None` when not tracing.
pub fn take() -> Option<String> {
    if !ferrite_core::env::cuda_trace() {
        return None;
    }
    let (recs, lost) = drain()?;
    let mut text = report(&recs);
    if lost > 0 {
        text += &format!("({lost} earlier records were overwritten: fewer tokens keep them all)\n");
    }
    Some(text)
}

/// `take`'s text for records sorted by release.
fn report(recs: &[Record]) -> String {
    // (calls, span ns, lead ns)
    let mut by_name: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    let span = |i: usize| recs.get(i + 1).map(|n| n.left - recs[i].left).filter(|&s| s < GAP_NS);
    let mut total = 0u64;
    for (i, r) in recs.iter().enumerate() {
        let Some(s) = span(i) else { continue };
        let e = by_name.entry(&r.name).or_default();
        e.0 += 1;
        e.1 += s;
        e.2 += r.left - r.arrived;
        total += s;
    }
    let mut rows: Vec<_> = by_name.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1 .1));
    let mut out = format!(
        "kernel timeline: {} records, {:.3} ms between releases\n| waiting function | calls | ms | share | mean us | mean lead us |\n|---|---|---|---|---|---|\n",
        recs.len(),
        total as f64 * 1e-6
    );
    for (name, (calls, ns, lead)) in rows {
        let c = calls.max(1) as f64;
        out += &format!(
            "| {name} | {calls} | {:.3} | {:.1}% | {:.2} | {:.2} |\n",
            ns as f64 * 1e-6,
            100.0 * ns as f64 / total.max(1) as f64,
            ns as f64 * 1e-3 / c,
            lead as f64 * 1e-3 / c
        );
    }
    let samples: Vec<usize> =
        recs.iter().enumerate().filter(|(_, r)| r.name.starts_with("sample")).map(|(i, _)| i).collect();
    if let [.., a, b] = samples[..] {
        out += "one step, in order (us from release to the next release; lead):\n";
        for (i, r) in recs.iter().enumerate().take(b + 1).skip(a + 1) {
            let s = span(i).unwrap_or(0) as f64 * 1e-3;
            out += &format!("  {:<16} {s:8.2} {:8.2}\n", r.name, (r.left - r.arrived) as f64 * 1e-3);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(arrived: u64, left: u64, name: &str) -> Record {
        Record { arrived, left, name: name.into() }
    }

    #[test]
    fn spans_run_from_release_to_release_and_skip_gaps() {
        let recs = [
            rec(0, 0, "sample_split"),
            rec(500, 1_000, "gemv"),
            rec(1_000, 4_000, "quantize"),
            rec(4_000, 6_000, "gemv"),
            rec(6_000, 7_000, "sample_split"),
            // The host's gap before the next step: not a kernel's time.
            rec(3_000_000, 3_000_000, "gemv"),
        ];
        let text = report(&recs);
        // gemv: (4,000 - 1,000) + (7,000 - 6,000) ns over two calls, leads 500 and 2,000.
        assert!(text.contains("| gemv | 2 | 0.004 | 57.1% | 2.00 | 1.25 |"), "{text}");
        assert!(text.contains("| quantize | 1 | 0.002 | 28.6% | 2.00 | 3.00 |"), "{text}");
        assert!(text.contains("| sample_split | 1 | 0.001 | 14.3% | 1.00 | 0.00 |"), "{text}");
        // One step: the kernels after the first sampling, through the second.
        let step: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("one step")).skip(1).collect();
        assert_eq!(step.len(), 4, "{text}");
        assert!(step[0].trim_start().starts_with("gemv") && step[3].trim_start().starts_with("sample_split"));
    }
}
