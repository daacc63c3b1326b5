//! Where the sampling kernels leave their picks: one device buffer, which
//! the next step's embedding reads through fed ids (`picks::FED_TOKEN`),
//! copied back to the host into a ring of page-locked buffers so that the
//! host can wait for them while that step runs. The copies back run on a
//! stream of their own and the sampling arguments are uploaded only when
//! they change: each copy between a step's last kernel and the next step's
//! first costs the device a few microseconds.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice};
use ferrite_core::{Error, Result};

use super::device::{device_err, SAMPLE_ROWS};
use crate::picks::{fed_row, Picks};

/// Host buffers in the ring: picks may be waited for up to this many
/// sampling launches later.
const RING: usize = 4;

/// A page-locked copy of the picks, the launch it holds, and the event
/// recorded after its copy (the stream's own bookkeeping is off).
struct Slot {
    words: PinnedHostSlice<u32>,
    launch: u64,
    copied: CudaEvent,
}

/// Words on the host and their copy on the device.
type Uploaded = (Vec<u32>, Arc<CudaSlice<u32>>);

pub struct PickBuffers {
    /// (token, logprob bits) per row of the last sampling launch:
    /// `2 * SAMPLE_ROWS` words.
    pub device: CudaSlice<u32>,
    /// Copies back run here, so that the next step need not wait for them:
    /// after `drawn` (recorded on the main stream after the sampling
    /// launch), before `back_done`, which the next sampling launch waits for.
    back: Arc<CudaStream>,
    drawn: CudaEvent,
    back_done: CudaEvent,
    ring: Mutex<Ring>,
    /// The last sampling arguments uploaded (kernels/sample.cu's params and
    /// edits), reused while they stay the same: rows with fixed seeds, as
    /// `bench`'s (generation draws a seed a step, so it uploads each step,
    /// once).
    args: Mutex<Option<Uploaded>>,
}

#[derive(Default)]
struct Ring {
    /// Made at the first `copy_back` (most runs never ask).
    slots: Vec<Arc<Mutex<Slot>>>,
    launches: u64,
}

impl PickBuffers {
    pub fn new(stream: &Arc<CudaStream>) -> Result<PickBuffers> {
        let device = stream.alloc_zeros::<u32>(2 * SAMPLE_ROWS).map_err(|e| device_err("alloc", e))?;
        let ctx = stream.context();
        let back = ctx.new_stream().map_err(|e| device_err("creating a stream", e))?;
        let event = || ctx.new_event(None).map_err(|e| device_err("event", e));
        let (drawn, back_done) = (event()?, event()?);
        Ok(PickBuffers { device, back, drawn, back_done, ring: Mutex::default(), args: Mutex::default() })
    }

    /// `words` on the device: the last upload when they are the same.
    pub fn args(&self, stream: &Arc<CudaStream>, words: Vec<u32>) -> Result<Arc<CudaSlice<u32>>> {
        let mut last = self.args.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((w, buf)) = last.as_ref() {
            if *w == words {
                return Ok(buf.clone());
            }
        }
        let buf = Arc::new(stream.clone_htod(&words).map_err(|e| device_err("upload", e))?);
        *last = Some((words, buf.clone()));
        Ok(buf)
    }

    /// Orders a sampling launch after the last copy back of the picks it overwrites.
    pub fn before_sample(&self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.wait(&self.back_done).map_err(|e| device_err("event wait", e))
    }

    /// The picks of `rows` rows, copied back now, waiting for them.
    pub fn read(&self, stream: &Arc<CudaStream>, rows: usize) -> Result<Vec<(u32, f32)>> {
        download(stream, &self.device.slice(..2 * rows))
    }

    /// The picks of `rows` rows, copied back in stream order; `wait` blocks
    /// until they are on the host.
    pub fn copy_back(&self, stream: &Arc<CudaStream>, rows: usize) -> Result<Picks> {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.slots.is_empty() {
            for _ in 0..RING {
                // SAFETY: only the words a copy wrote are read (`pairs` below).
                let words = unsafe { stream.context().alloc_pinned_with_flags::<u32>(2 * SAMPLE_ROWS, 0) }
                    .map_err(|e| device_err("page-locked alloc", e))?;
                let copied = stream.context().new_event(None).map_err(|e| device_err("event", e))?;
                ring.slots.push(Arc::new(Mutex::new(Slot { words, launch: 0, copied })));
            }
        }
        ring.launches += 1;
        let launch = ring.launches;
        let slot = ring.slots[launch as usize % RING].clone();
        drop(ring);
        {
            let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
            let back = &self.back;
            self.drawn.record(stream).map_err(|e| device_err("event", e))?;
            back.wait(&self.drawn).map_err(|e| device_err("event wait", e))?;
            back.memcpy_dtoh(&self.device.slice(..2 * rows), &mut s.words).map_err(|e| device_err("download", e))?;
            s.copied.record(back).map_err(|e| device_err("event", e))?;
            self.back_done.record(back).map_err(|e| device_err("event", e))?;
            s.launch = launch;
        }
        Ok(Picks::later(move || {
            let s = slot.lock().unwrap_or_else(|p| p.into_inner());
            if s.launch != launch {
                return Err(Error::Device(format!("sampled tokens overwritten before read (more than {RING} ahead)")));
            }
            s.copied.synchronize().map_err(|e| device_err("download", e))?;
            let words = s.words.as_slice().map_err(|e| device_err("download", e))?;
            Ok(pairs(&words[..2 * rows]))
        }))
    }
}

/// Token ids are rows of a table of `vocab` rows, or fed ids naming a row
/// of the last sampling launch (picks.rs).
pub fn check_ids(ids: &[u32], vocab: usize) -> Result<()> {
    for &id in ids {
        let bad = match fed_row(id) {
            Some(row) if row >= SAMPLE_ROWS => {
                format!("fed token id {id:#x}: sampling launches draw at most {SAMPLE_ROWS} rows")
            }
            None if id as usize >= vocab => format!("token id {id} is outside the vocabulary ({vocab} tokens)"),
            _ => continue,
        };
        return Err(Error::InvalidInput(bad));
    }
    Ok(())
}

/// Picks (token, logprob bits words) copied back now, waiting for them.
pub fn download(stream: &Arc<CudaStream>, words: &impl DevicePtr<u32>) -> Result<Vec<(u32, f32)>> {
    Ok(pairs(&stream.clone_dtoh(words).map_err(|e| device_err("download", e))?))
}

fn pairs(words: &[u32]) -> Vec<(u32, f32)> {
    words.chunks_exact(2).map(|w| (w[0], f32::from_bits(w[1]))).collect()
}
