//! `ferrite bench-serve` (being written).
use clap::Args;
use ferrite_core::Result;

#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Base URL of an OpenAI-compatible server.
    #[arg(long)]
    pub url: String,
}

pub fn main(_args: BenchServeArgs) -> Result<()> {
    Err(ferrite_core::Error::Unsupported("bench-serve: being written".into()))
}
