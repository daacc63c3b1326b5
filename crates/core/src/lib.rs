//! Shared vocabulary of ferrite: element types, shapes and the error type.

pub mod dtype;
pub mod env;
pub mod error;
pub mod quiet_panic;

pub use dtype::DType;
pub use error::{Error, Result};
pub mod bytes;
pub use bytes::HostBytes;
