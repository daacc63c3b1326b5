//! CUDA graphs for decode steps and encoder passes.
//!
//! A decode step (one new token per sequence, every row's logits wanted)
//! launches the same kernels with the same shapes at a given batch size; only
//! its inputs change: token ids, positions, KV slots and attention metadata.
//! Those live in one device buffer per batch size, at fixed places, so the
//! step is captured once and then replayed after the buffer is rewritten: the
//! host issues one launch instead of hundreds.
//!
//! The first step of a size runs eagerly: it warms what capture may not do
//! (cuBLASLt plans, uploads of constants). The second is captured. A size
//! whose capture fails runs eagerly from then on; a step whose input is bad
//! fails as it would eagerly, and the size is captured at a later step.
//!
//! Encoder passes go the same way per shape (padded rows, pooled sequences,
//! pooling), their inputs laid out by `encode_graph`. (Capturing a shape at
//! first sight instead was measured: no faster on the benchmark corpus, and
//! a server seeing many shapes once would pay a capture for each.)

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaGraph, CudaSlice, CudaView, DevicePtr};
use ferrite_core::{Error, Result};

use super::capture_alloc::{new_pool, own_pool_pays, Pool};
use super::device::{device_err, Device};
use super::encode_graph::{self, EncodeInputs};
use super::kv::paged_meta;
use super::CudaTensor;
use crate::{DecodeStep, EncodeStep};

/// Batches of more rows than this always run eagerly.
pub const MAX_GRAPH_ROWS: usize = 256;

/// Decode steps of up to this many rows take their memory from a pool of
/// their own while captured, so that their kernels start early
/// (capture_alloc.rs). Measured on the H200 (Llama-3.1-8B, Q4_K_M): 3.7%
/// faster at batch 1, 1.3% at 4, but 1.5% slower at 8.
const OWN_POOL_ROWS: usize = 4;

/// Device words an op reads: an uploaded array, or a part of a graph's step
/// inputs.
pub struct Words {
    buf: Arc<CudaSlice<u32>>,
    range: Range<usize>,
}

impl Words {
    pub fn all(buf: Arc<CudaSlice<u32>>) -> Words {
        let range = 0..buf.len();
        Words { buf, range }
    }
    /// Words `range` of `buf` (cut to its length).
    pub fn part(buf: Arc<CudaSlice<u32>>, range: Range<usize>) -> Words {
        let end = range.end.min(buf.len());
        Words { range: range.start.min(end)..end, buf }
    }
    /// No words, of the same buffer.
    pub fn none(&self) -> Words {
        Words { buf: self.buf.clone(), range: 0..0 }
    }
    pub fn len(&self) -> usize {
        self.range.len()
    }
    /// Where these words are in their buffer.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }
    pub fn view(&self) -> CudaView<'_, u32> {
        self.buf.slice(self.range.clone())
    }
}

/// Which input of a decode step.
#[derive(Clone, Copy)]
pub enum Field {
    Ids,
    Positions,
    Slots,
    /// The rows the attention kernel takes: all of them, in order.
    Rows,
    /// (lo, hi, table offset) per row (`paged_meta`).
    AttnMeta,
    /// Every sequence's block table, after the metadata.
    Tables,
}

/// A decode step's inputs on the device: ids | positions | slots | rows |
/// attention metadata (3 words a row) | block tables, `cap` words in all.
#[derive(Clone)]
pub struct StepInputs {
    buf: Arc<CudaSlice<u32>>,
    n: usize,
}

impl StepInputs {
    pub fn words(&self, f: Field) -> Words {
        let n = self.n;
        let range = match f {
            Field::Ids => 0..n,
            Field::Positions => n..2 * n,
            Field::Slots => 2 * n..3 * n,
            Field::Rows => 3 * n..4 * n,
            Field::AttnMeta => 4 * n..7 * n,
            Field::Tables => 7 * n..self.buf.len(),
        };
        Words { buf: self.buf.clone(), range }
    }
}

/// The words of `StepInputs`, in its layout.
fn pack(step: &DecodeStep) -> Vec<u32> {
    let n = step.tokens.len();
    let mut w = Vec::with_capacity(8 * n);
    w.extend_from_slice(step.tokens);
    w.extend_from_slice(step.positions);
    w.extend(step.attn.slots.iter().map(|&s| s as u32));
    w.extend(0..n as u32);
    w.extend(paged_meta(step.attn, n).0);
    w
}

/// What the ops of a captured step checked against, for replays to check too.
#[derive(Clone, Default)]
pub struct Limits {
    pub vocab: usize,
    pub kv_blocks: usize,
    pub block_size: usize,
    /// Words of the inputs that index a table, and its rows (encoder passes:
    /// token ids and positions).
    pub bounds: Vec<(Range<usize>, usize)>,
}

/// A captured graph. CUDA graphs must not be used by two threads at once:
/// every use is under the lock of the map that holds it.
struct Graph(CudaGraph);
// SAFETY: see above; the handles themselves may move between threads.
unsafe impl Send for Graph {}

/// What a graph reads: a decode step's inputs or an encoder pass's.
#[derive(Clone)]
pub enum Inputs {
    Decode(StepInputs),
    Encode(EncodeInputs),
}

impl Inputs {
    fn buf(&self) -> &Arc<CudaSlice<u32>> {
        match self {
            Inputs::Decode(s) => &s.buf,
            Inputs::Encode(e) => &e.buf,
        }
    }
}

/// The rows an encoder batch of `n` tokens is padded to, so that batches of
/// similar sizes share a graph: a multiple of an eighth of the power of two
/// at or below `n` (at least 64 rows), at most 1/8 padding.
pub fn encoder_rows(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let step = ((1usize << n.ilog2()) / 8).max(64);
    n.next_multiple_of(step)
}

/// Encoder shapes kept at most, graphs and shapes seen once (each graph holds
/// its activations' memory).
const MAX_ENCODER_GRAPHS: usize = 16;

struct Captured {
    graph: Graph,
    inputs: Inputs,
    out: GraphOut,
    limits: Limits,
}

/// Where a graph leaves its logits.
enum GraphOut {
    /// A graph allocation (pointer, rows, cols), freed after each replay.
    Alloc(sys::CUdeviceptr, usize, usize),
    /// Captured from a pool of the graph's own: a buffer that stays the graph's.
    Own(CudaTensor),
}

enum Size {
    /// Ran once eagerly; the next step of this size is captured.
    Warm,
    Ready(Box<Captured>),
    /// Capture failed: always eager.
    Eager,
}

/// Per-model graph state (a backend's clones each get their own).
#[derive(Default)]
pub struct Graphs {
    sizes: Mutex<HashMap<usize, Size>>,
    /// Encoder passes by (padded rows, pooled sequences, key).
    encoders: Mutex<HashMap<(usize, usize, u32), Size>>,
    /// Set while a step is captured: the ops read their inputs from here.
    capturing: Mutex<Option<(Inputs, Limits)>>,
    /// The decode steps' own memory pool (kept for recaptures; the last
    /// field, dropped after the graphs that use it). One for every batch
    /// size: their graphs replay one at a time on the device's stream, and
    /// what must outlive a replay, the logits, stays allocated.
    pool: Box<OwnPoolSlot>,
}

/// The own pool, made at the first capture that asks for it, and whether a
/// capture with it failed (later ones then go without it).
#[derive(Default)]
struct OwnPoolSlot {
    pool: Mutex<Option<OwnPool>>,
    refused: AtomicBool,
}

/// A memory pool and the stream its graphs run on.
struct OwnPool(Pool, Arc<cudarc::driver::CudaStream>);

impl Drop for OwnPool {
    fn drop(&mut self) {
        // Nothing of a graph may still run on the pool's memory.
        let _ = self.1.synchronize();
        self.0.destroy();
    }
}

impl Graphs {
    fn inputs(&self) -> Option<Inputs> {
        self.capturing.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|c| c.0.clone())
    }

    /// The decode step being captured.
    pub fn capturing(&self) -> Option<StepInputs> {
        match self.inputs()? {
            Inputs::Decode(s) => Some(s),
            Inputs::Encode(_) => None,
        }
    }

    /// The encoder pass being captured.
    pub fn encoding(&self) -> Option<EncodeInputs> {
        match self.inputs()? {
            Inputs::Encode(e) => Some(e),
            Inputs::Decode(_) => None,
        }
    }

    /// Whether anything is being captured (nothing may be uploaded).
    pub fn is_capturing(&self) -> bool {
        self.inputs().is_some()
    }

    /// Ops of a captured step note what they checked against.
    pub fn note(&self, f: impl FnOnce(&mut Limits)) {
        if let Some(c) = self.capturing.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            f(&mut c.1);
        }
    }

    /// Forgets every decode graph (their KV pool is gone).
    pub fn clear(&self) {
        self.sizes.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Runs `forward`, an encoder pass over `step`: replayed, captured, or
    /// eager, as decode steps are.
    pub fn run_encode(
        &self,
        dev: &Device,
        step: &EncodeStep,
        forward: &mut dyn FnMut() -> Result<CudaTensor>,
    ) -> Result<CudaTensor> {
        let span = |name| super::profile::pass_span(&dev.stream, name);
        let Some(fields) = encode_graph::fields(step) else {
            let _span = span("encoder pass (eager)");
            return forward();
        };
        let key = (step.tokens.len(), step.pooled, step.key);
        let words = encode_graph::pack(&fields);
        let mut shapes = self.encoders.lock().unwrap_or_else(|p| p.into_inner());
        match shapes.get(&key) {
            // A shape seen once never pays for a capture (serving sees many).
            None => {
                // Full: forget the shapes seen once first, graphs only if need be.
                if shapes.len() >= MAX_ENCODER_GRAPHS {
                    shapes.retain(|_, s| !matches!(s, Size::Warm));
                }
                if shapes.len() >= MAX_ENCODER_GRAPHS {
                    shapes.clear();
                }
                shapes.insert(key, Size::Warm);
                drop(shapes);
                let _span = span("encoder pass (eager)");
                return forward();
            }
            Some(Size::Eager) => {
                drop(shapes);
                let _span = span("encoder pass (eager)");
                return forward();
            }
            Some(Size::Ready(c)) => {
                let _span = span("encoder pass (replayed)");
                for (range, rows) in &c.limits.bounds {
                    if let Some(id) = words[range.clone()].iter().find(|&&id| id as usize >= *rows) {
                        return Err(Error::InvalidInput(format!(
                            "token id {id} is outside the vocabulary ({rows} tokens)"
                        )));
                    }
                }
                write_words(dev, c.inputs.buf(), &words)?;
                c.graph.0.launch().map_err(|e| device_err("replaying an encoder pass", e))?;
                return take_output(dev, c);
            }
            // This batch's arrays would not tell the fields apart: capture a later one.
            Some(Size::Warm) if !encode_graph::distinct(&fields) => {
                drop(shapes);
                let _span = span("encoder pass (eager)");
                return forward();
            }
            Some(Size::Warm) => {}
        }
        shapes.remove(&key);
        drop(shapes);
        let _span = span("encoder pass (captured)");
        let buf = Arc::new(dev.stream.alloc_zeros::<u32>(words.len()).map_err(|e| device_err("encoder inputs", e))?);
        write_words(dev, &buf, &words)?;
        let inputs = Inputs::Encode(EncodeInputs::new(buf, fields));
        let captured = self.capture(dev, inputs, forward, false);
        let what = format!("encoder passes of {} rows", step.tokens.len());
        settle(&self.encoders, key, captured, &what, forward)
    }

    /// Runs `forward`, a decode step with inputs `step`: replayed, captured,
    /// or eager (see the module doc).
    pub fn run(
        &self,
        dev: &Device,
        step: &DecodeStep,
        forward: &mut dyn FnMut() -> Result<CudaTensor>,
    ) -> Result<CudaTensor> {
        let n = step.tokens.len();
        let words = pack(step);
        let mut sizes = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
        match sizes.get(&n) {
            None => {
                sizes.insert(n, Size::Warm);
                drop(sizes);
                return forward();
            }
            Some(Size::Eager) => {
                drop(sizes);
                return forward();
            }
            Some(Size::Ready(c)) if c.inputs.buf().len() >= words.len() => {
                check(step, &c.limits)?;
                write_words(dev, c.inputs.buf(), &words)?;
                c.graph.0.launch().map_err(|e| device_err("replaying a decode step", e))?;
                return take_output(dev, c);
            }
            // Warm, or the block tables outgrew the buffer: (re)capture.
            Some(_) => {}
        }
        sizes.remove(&n);
        drop(sizes);
        let cap = words.len() + (words.len() - 7 * n).max(64);
        let buf = Arc::new(dev.stream.alloc_zeros::<u32>(cap).map_err(|e| device_err("step inputs", e))?);
        write_words(dev, &buf, &words)?;
        let inputs = Inputs::Decode(StepInputs { buf, n });
        let own_pool =
            n <= OWN_POOL_ROWS && dev.pdl && own_pool_pays(dev) && !self.pool.refused.load(Ordering::Relaxed);
        let mut captured = self.capture(dev, inputs.clone(), forward, own_pool);
        if own_pool && matches!(&captured, Err(e) if !is_bad_input(e)) {
            // A graph with memory nodes still beats eager steps.
            if let Err(e) = &captured {
                eprintln!("note: decode steps captured without their own memory pool from now on ({e})");
            }
            self.pool.refused.store(true, Ordering::Relaxed);
            captured = self.capture(dev, inputs, forward, false);
        }
        settle(&self.sizes, n, captured, &format!("decode steps of {n} rows"), forward)
    }

    fn capture(
        &self,
        dev: &Device,
        inputs: Inputs,
        forward: &mut dyn FnMut() -> Result<CudaTensor>,
        own_pool: bool,
    ) -> Result<(Captured, CudaTensor)> {
        let pool = match own_pool {
            true => {
                let mut own = self.pool.pool.lock().unwrap_or_else(|p| p.into_inner());
                if own.is_none() {
                    *own = Some(OwnPool(new_pool(dev)?, dev.stream.clone()));
                }
                own.as_ref().map(|p| p.0)
            }
            false => None,
        };
        *self.capturing.lock().unwrap_or_else(|p| p.into_inner()) = Some((inputs.clone(), Limits::default()));
        // The pool's allocations run on a side stream while this one
        // captures, which the thread-local mode refuses
        // (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, measured).
        let mode = match pool {
            Some(_) => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            None => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        };
        let begun = dev.stream.begin_capture(mode).map_err(|e| device_err("starting a graph capture", e));
        // (Unset when dropped, even by a panic in `forward`.)
        let _from_pool = dev.capture.from(pool);
        let result = begun.and_then(|_| forward());
        drop(_from_pool);
        let limits = self.capturing.lock().unwrap_or_else(|p| p.into_inner()).take().map(|c| c.1).unwrap_or_default();
        // Capture must end whatever happened, or the stream stays unusable.
        let ended = dev.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let logits = result?;
        let graph = ended
            .map_err(|e| device_err("instantiating a graph", e))?
            .ok_or_else(|| Error::Device("graph capture recorded nothing".into()))?;
        graph.launch().map_err(|e| device_err("launching a graph", e))?;
        // The captured tensor is the graph's allocation: hand back a copy, as replays do.
        let copy = copy_tensor(dev, &logits)?;
        let out = match pool {
            Some(_) => GraphOut::Own(logits),
            // (Dropping `logits` frees the graph's allocation for the next launch.)
            None => GraphOut::Alloc(logits.f32(dev)?.device_ptr(&dev.stream).0, logits.rows, logits.cols),
        };
        Ok((Captured { graph: Graph(graph), inputs, out, limits }, copy))
    }
}

/// Files a capture's outcome under `key`: the graph; or, for bad input (a
/// token outside the vocabulary, a block table outside the pool), which
/// fails eagerly too, the error, capturing again next time; or, for anything
/// else, eager passes from now on, starting with this one.
fn settle<K: std::hash::Hash + Eq>(
    map: &Mutex<HashMap<K, Size>>,
    key: K,
    captured: Result<(Captured, CudaTensor)>,
    what: &str,
    forward: &mut dyn FnMut() -> Result<CudaTensor>,
) -> Result<CudaTensor> {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    match captured {
        Ok((c, out)) => {
            map.insert(key, Size::Ready(Box::new(c)));
            Ok(out)
        }
        Err(e) if is_bad_input(&e) => {
            map.insert(key, Size::Warm);
            Err(e)
        }
        Err(e) => {
            map.insert(key, Size::Eager);
            drop(map);
            eprintln!("note: {what} run without a CUDA graph ({e})");
            forward()
        }
    }
}

/// Errors that eager passes meet too: the step's input, not the capture.
fn is_bad_input(e: &Error) -> bool {
    matches!(e, Error::InvalidInput(_) | Error::Shape(_))
}

/// Replays skip the ops' own checks: the same ones, on the host.
fn check(step: &DecodeStep, l: &Limits) -> Result<()> {
    super::picks::check_ids(step.tokens, l.vocab)?;
    step.attn.validate(step.tokens.len(), l.kv_blocks, l.block_size)?;
    if let Some(s) = step.attn.slots.iter().find(|&&s| s >= l.kv_blocks * l.block_size) {
        return Err(Error::Shape(format!("KV slot {s} outside the pool")));
    }
    Ok(())
}

fn write_words(dev: &Device, buf: &CudaSlice<u32>, words: &[u32]) -> Result<()> {
    let (ptr, _guard) = buf.device_ptr(&dev.stream);
    // SAFETY: the buffer holds at least `words.len()` words (checked by the
    // callers); the copy is ordered on the stream like every other use.
    unsafe { cudarc::driver::result::memcpy_htod_async(ptr, words, dev.stream.cu_stream()) }
        .map_err(|e| device_err("uploading step inputs", e))
}

/// The logits of a replay, copied out of the graph's allocation, which is
/// then freed so that the graph may run again (or out of the buffer of a
/// graph with its own pool, which stays).
fn take_output(dev: &Device, c: &Captured) -> Result<CudaTensor> {
    let (ptr, rows, cols) = match &c.out {
        GraphOut::Own(t) => return copy_tensor(dev, t),
        &GraphOut::Alloc(ptr, rows, cols) => (ptr, rows, cols),
    };
    // SAFETY: the graph allocated `rows * cols` f32 at `ptr` in this launch;
    // dropping the slice frees it, as a graph allocation must be before relaunch.
    let graph_out = unsafe { dev.stream.upgrade_device_ptr::<f32>(ptr, (rows * cols).max(1)) };
    let t = CudaTensor::new(graph_out, rows, cols);
    copy_tensor(dev, &t)
}

fn copy_tensor(dev: &Device, t: &CudaTensor) -> Result<CudaTensor> {
    let buf = dev.stream.clone_dtod(t.f32(dev)?).map_err(|e| device_err("copying logits", e))?;
    Ok(CudaTensor::new(buf, t.rows, t.cols))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttnBatch, SeqSlice};

    #[test]
    fn encoder_rows_pad_at_most_an_eighth() {
        assert_eq!(encoder_rows(0), 0);
        assert_eq!(encoder_rows(1), 64);
        assert_eq!(encoder_rows(64), 64);
        assert_eq!(encoder_rows(65), 128);
        assert_eq!(encoder_rows(1300), 1408);
        assert_eq!(encoder_rows(10_000), 10_240);
        for n in 1..5000 {
            let r = encoder_rows(n);
            assert!(r >= n && (r - n) * 8 <= n.max(512), "{n} -> {r}");
        }
    }

    #[test]
    fn step_inputs_are_packed_where_the_fields_say() {
        let attn = AttnBatch {
            seqs: vec![
                SeqSlice { q_start: 0, q_len: 1, ctx_len: 5, block_table: vec![7] },
                SeqSlice { q_start: 1, q_len: 1, ctx_len: 20, block_table: vec![2, 4, 9, 11] },
            ],
            block_size: 8,
            slots: vec![60, 35],
        };
        let step = DecodeStep { tokens: &[11, 12], positions: &[4, 19], attn: &attn };
        let w = pack(&step);
        // ids | positions | slots | rows | (lo, hi, table offset) per row | tables in use
        assert_eq!(&w[0..2], &[11, 12]);
        assert_eq!(&w[2..4], &[4, 19]);
        assert_eq!(&w[4..6], &[60, 35]);
        assert_eq!(&w[6..8], &[0, 1]);
        assert_eq!(&w[8..14], &[0, 5, 0, 0, 20, 1]);
        assert_eq!(&w[14..], &[7, 2, 4, 9]);
    }
}
