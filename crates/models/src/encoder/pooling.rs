//! Pooling: how an encoder's token states become one vector per input, done
//! on the backend so only the vectors leave it.

use std::ops::Range;

use ferrite_backend::{Backend, Reduce};
use ferrite_core::Result;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's state (`[CLS]`).
    Cls,
    /// The mean over every token of the input, special tokens included.
    Mean,
    /// The last token's state.
    LastToken,
    /// The element-wise maximum over the tokens.
    Max,
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cls" => Ok(Pooling::Cls),
            "mean" => Ok(Pooling::Mean),
            "last" | "lasttoken" | "last_token" => Ok(Pooling::LastToken),
            "max" => Ok(Pooling::Max),
            _ => Err(format!("unknown pooling {s:?} (cls, mean, last or max)")),
        }
    }
}

/// One pooled row per sequence of `seqs` from the token states `x`
/// [tokens, hidden]: [seqs, hidden], where `x` is.
pub(crate) fn pool<B: Backend>(be: &B, x: &B::Tensor, seqs: &[Range<usize>], pooling: Pooling) -> Result<B::Tensor> {
    match pooling {
        Pooling::Cls => be.rows(x, &seqs.iter().map(|s| s.start).collect::<Vec<_>>()),
        Pooling::LastToken => be.rows(x, &seqs.iter().map(|s| s.end - 1).collect::<Vec<_>>()),
        Pooling::Mean => be.reduce_segments(x, seqs, Reduce::Mean),
        Pooling::Max => be.reduce_segments(x, seqs, Reduce::Max),
    }
}
