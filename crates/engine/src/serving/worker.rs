//! The engine thread (being written).
use std::sync::{mpsc, Arc};

use ferrite_core::Result;
use ferrite_loader::tokenizer::Tokenizer;

use super::{Command, EngineConfig, Shared};
use crate::runner::Runner;

pub(super) struct Worker {
    _runner: Runner,
}

impl Worker {
    pub(super) fn new(runner: Runner, _tok: Arc<Tokenizer>, _cfg: EngineConfig, _shared: Arc<Shared>) -> Result<Self> {
        Ok(Worker { _runner: runner })
    }
    pub(super) fn run(self, rx: mpsc::Receiver<Command>) {
        while let Ok(cmd) = rx.recv() {
            if let Command::Shutdown = cmd {
                break;
            }
        }
    }
}
