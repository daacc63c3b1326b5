//! `ferrite serve` (being written).
use clap::Args;
use ferrite_core::Result;

use crate::ModelArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn main(_args: ServeArgs) -> Result<()> {
    Err(ferrite_core::Error::Unsupported("serve: being written".into()))
}
