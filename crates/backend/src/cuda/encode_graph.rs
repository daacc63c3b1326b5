//! What an encoder pass's graph reads: its inputs as fields of one device
//! buffer, rewritten before each replay.
//!
//! An encoder pass is one shape per (padded rows, pooled sequences, pooling):
//! its ops launch the same kernels on the same grids whatever the tokens and
//! sequence lengths, once the varying arrays they read are at fixed places
//! with fixed lengths. Those arrays are the fields below. While a pass is
//! captured, an op finds the field holding the array it would have uploaded
//! (by content); a replay writes the new batch's fields and launches.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use ferrite_core::{Error, Result};

use super::graph::Words;
use crate::EncodeStep;

/// Query rows per tile of the encoder attention kernel (kernels/encoder.cu).
pub const TILE_ROWS: usize = 64;

/// The encoder attention kernel's tiles: (first row, rows, sequence start,
/// sequence end) for each run of up to `TILE_ROWS` query rows of a sequence.
pub fn attention_tiles(seqs: &[Range<usize>]) -> Vec<u32> {
    let mut tiles = Vec::new();
    for s in seqs {
        for r0 in s.clone().step_by(TILE_ROWS) {
            tiles.extend([r0, TILE_ROWS.min(s.end - r0), s.start, s.end].map(|x| x as u32));
        }
    }
    tiles
}

/// The fields of a step, each the array an op reads: token ids, positions,
/// attention tiles (then empty tiles up to a count fixed by the shape),
/// the pooled sequences' bounds, first rows and last rows. None when the
/// tiles outnumber that count (padding of very short sequences).
pub fn fields(step: &EncodeStep) -> Option<Vec<Vec<u32>>> {
    let n = step.tokens.len();
    let pooled = &step.seqs[..step.pooled.min(step.seqs.len())];
    let mut tiles = attention_tiles(step.seqs);
    // Each sequence has at most one tile more than its rows / TILE_ROWS, and
    // padding adds at most n / TILE_ROWS + 1 sequences (of TILE_ROWS rows
    // or fewer, see `EncodeBatch::padded`).
    let capacity = 4 * (2 * n.div_ceil(TILE_ROWS) + step.pooled + 1);
    if tiles.len() > capacity {
        return None;
    }
    tiles.resize(capacity, 0);
    Some(vec![
        step.tokens.to_vec(),
        step.positions.to_vec(),
        tiles,
        pooled.iter().flat_map(|s| [s.start as u32, s.end as u32]).collect(),
        pooled.iter().map(|s| s.start as u32).collect(),
        pooled.iter().map(|s| s.end as u32 - 1).collect(),
    ])
}

/// Whether `host` could be field `f`'s words: equal, then zeros (the padded
/// tiles).
fn matches(f: &[u32], host: &[u32]) -> bool {
    f.len() >= host.len() && f[..host.len()] == *host && f[host.len()..].iter().all(|&w| w == 0)
}

/// Whether every field tells itself apart from the others, so that an op's
/// array finds one field only (all sequences of one token make the first and
/// last rows equal, for one): a batch where not is not captured.
pub fn distinct(fields: &[Vec<u32>]) -> bool {
    fields.iter().enumerate().all(|(i, a)| fields.iter().enumerate().all(|(j, b)| i == j || !matches(b, a)))
}

/// A captured pass's inputs: one device buffer and, while capturing, each
/// field's range and words (to find the field an op reads).
#[derive(Clone)]
pub struct EncodeInputs {
    pub buf: Arc<CudaSlice<u32>>,
    fields: Arc<Vec<(Range<usize>, Vec<u32>)>>,
}

impl EncodeInputs {
    /// The fields laid out back to back in `buf` (which holds `pack(fields)`).
    pub fn new(buf: Arc<CudaSlice<u32>>, fields: Vec<Vec<u32>>) -> EncodeInputs {
        let mut at = 0;
        let fields = fields
            .into_iter()
            .map(|f| {
                let r = at..at + f.len();
                at = r.end;
                (r, f)
            })
            .collect();
        EncodeInputs { buf, fields: Arc::new(fields) }
    }

    /// The field an op reads in place of uploading `host`: the one whose
    /// words are `host` (then zeros, for the padded tiles). None or several
    /// is an error, which makes the capture fail and the shape run eagerly.
    pub fn find(&self, host: &[u32]) -> Result<Words> {
        let mut found = self.fields.iter().filter(|(_, f)| matches(f, host));
        match (found.next(), found.next()) {
            (Some((r, _)), None) => Ok(Words::part(self.buf.clone(), r.clone())),
            (None, _) => Err(Error::Device("an encoder op read an array that is not among the pass's inputs".into())),
            (Some(_), Some(_)) => Err(Error::Device("an encoder op's array matches two of the pass's inputs".into())),
        }
    }
}

/// The fields' words back to back.
pub fn pack(fields: &[Vec<u32>]) -> Vec<u32> {
    fields.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_have_fixed_lengths_per_shape() {
        let seqs = [0..3, 3..70, 70..72];
        let tokens: Vec<u32> = (100..172).collect();
        let positions: Vec<u32> = seqs.iter().flat_map(|s| 0..s.len() as u32).collect();
        let step = EncodeStep { tokens: &tokens, positions: &positions, seqs: &seqs, pooled: 2, key: 0 };
        let f = fields(&step).unwrap();
        assert_eq!(f[0], tokens);
        assert_eq!(f[1], positions);
        // Sequence 3..70 spans two tiles; the rest are empty tiles.
        assert_eq!(&f[2][..16], &[0, 3, 0, 3, 3, 64, 3, 70, 67, 3, 3, 70, 70, 2, 70, 72]);
        assert_eq!(f[2].len(), 4 * (2 * 2 + 2 + 1));
        assert!(f[2][16..].iter().all(|&w| w == 0));
        assert_eq!(f[3], [0, 3, 3, 70]);
        assert_eq!(f[4], [0, 3]);
        assert_eq!(f[5], [2, 69]);
        assert!(distinct(&f));
        // Sequences of one token each: first rows equal last rows.
        let seqs = [0..1, 1..2];
        let step = EncodeStep { tokens: &[5, 6], positions: &[0, 0], seqs: &seqs, pooled: 2, key: 0 };
        assert!(!distinct(&fields(&step).unwrap()));
        // Too many tiles for the shape (a model accepting one-row sequences).
        let seqs: Vec<_> = (0..64).map(|i| i..i + 1).collect();
        let positions = [0; 64];
        let step = EncodeStep { tokens: &[7; 64], positions: &positions, seqs: &seqs, pooled: 1, key: 0 };
        assert!(fields(&step).is_none());
    }
}
