//! One error type for the library crates; the CLI prints it as a single line.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Format(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("{0}")]
    Tokenizer(String),
    #[error("{0}")]
    Template(String),
    #[error("{0}")]
    InvalidInput(String),
    /// A GPU or its driver failed (no device, a library missing, a kernel error).
    #[error("CUDA: {0}")]
    Device(String),
    /// The server is at capacity; the request may be retried later.
    #[error("{0}")]
    Busy(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn format(msg: impl Into<String>) -> Self {
        Error::Format(msg.into())
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}
