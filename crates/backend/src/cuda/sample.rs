//! Sampling on the device: the launches `Backend::sample` and `sample_begin`
//! share (kernels/sample.cu).

use cudarc::driver::{CudaSlice, LaunchConfig};
use ferrite_core::{Error, Result};

use super::device::{self, device_err};
use super::{CudaBackend, CudaTensor};
use crate::RowSampling;

/// Where a sampling launch left its (token, logprob bits) words.
pub(super) enum Drawn {
    /// No rows: nothing launched.
    Nothing,
    /// In the device's pick buffer (`Device::picks`), which fed ids read.
    Picks,
    /// More rows than that buffer holds: a buffer of their own.
    Own(CudaSlice<u32>),
}

impl CudaBackend {
    /// One token per row of `logits` by `rows` (the logits are overwritten).
    pub(super) fn launch_sample(&self, logits: &mut CudaTensor, rows: &[RowSampling]) -> Result<Drawn> {
        if rows.len() != logits.rows {
            return Err(Error::Shape(format!("sampling {} rows of {} logits rows", rows.len(), logits.rows)));
        }
        if rows.is_empty() {
            return Ok(Drawn::Nothing);
        }
        if logits.cols == 0 {
            return Err(Error::Shape("sampling from an empty vocabulary".into()));
        }
        let (words, n_params) = pack_sampling(rows);
        let args = self.dev.picks.args(&self.dev.stream, words)?;
        let (params, edits) = (args.slice(..n_params), args.slice(n_params..));
        let own = match rows.len() <= device::SAMPLE_ROWS {
            true => None,
            // SAFETY: every row's thread 0 writes both of its words.
            false => Some(unsafe { self.dev.alloc::<u32>(2 * rows.len()) }.map_err(|e| device_err("alloc", e))?),
        };
        if own.is_some() && rows.iter().any(|r| r.pending.is_some()) {
            return Err(Error::Device("a pending token is read from the pick buffer, which holds fewer rows".into()));
        }
        // The last launch's picks may still be on their way back (picks.rs).
        self.dev.picks.before_sample(&self.dev.stream)?;
        let vocab = logits.cols as u32;
        // Greedy rows: shares of at least 1,024 tokens, at most 32 a row
        // (kernels/sample.cu); not with --deterministic, whose rows keep one
        // kernel (and one summation order) whatever the batch holds.
        let shares = logits.cols.div_ceil(1024).min(32) as u32;
        let greedy = rows.iter().all(|r| !(r.temperature > 0.0 && (1.0 / r.temperature).is_finite()));
        if greedy && shares > 1 && own.is_none() && !self.dev.deterministic {
            // SAFETY: every share's block writes its 4 words before the row's last reads them.
            let mut part = unsafe { self.dev.alloc::<f32>(4 * rows.len() * shares as usize) }
                .map_err(|e| device_err("alloc", e))?;
            let cfg =
                LaunchConfig { grid_dim: (rows.len() as u32, shares, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let (x, done) = (logits.f32_mut(&self.dev)?, &self.dev.sample_done);
            let out = &self.dev.picks.device;
            launch!(self, "sample_split", cfg, x, &vocab, &params, &edits, out, &mut part, done)?;
        } else {
            let cfg =
                LaunchConfig { grid_dim: (rows.len() as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
            let x = logits.f32_mut(&self.dev)?;
            let out = own.as_ref().unwrap_or(&self.dev.picks.device);
            launch!(self, "sample_rows", cfg, x, &vocab, &params, &edits, out)?;
        }
        Ok(own.map_or(Drawn::Picks, Drawn::Own))
    }
}

/// Rows' parameters (12 words each), then their edits (5 words each), as
/// kernels/sample.cu reads them; and where the edits start.
fn pack_sampling(rows: &[RowSampling]) -> (Vec<u32>, usize) {
    let mut params = Vec::with_capacity(12 * rows.len());
    let mut edits = Vec::new();
    for r in rows {
        let first = (edits.len() / 5) as u32;
        for e in &r.edits {
            edits.extend([e.token, e.bias.to_bits(), e.rep.to_bits(), e.sub.to_bits(), e.count]);
        }
        let end = (edits.len() / 5) as u32;
        let (t, p, m) = (r.temperature.to_bits(), r.top_p.to_bits(), r.min_p.to_bits());
        params.extend([t, r.top_k, p, m, r.seed as u32, (r.seed >> 32) as u32, first, end]);
        let pending = r.pending.map_or([0; 4], |q| [1, q.rep.to_bits(), q.presence.to_bits(), q.frequency.to_bits()]);
        params.extend(pending);
    }
    if edits.is_empty() {
        edits.push(0);
    }
    let n = params.len();
    params.extend(edits);
    (params, n)
}
