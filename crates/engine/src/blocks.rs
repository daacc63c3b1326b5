//! Paged KV block accounting: fixed-size blocks handed out from a free list and
//! per-sequence block tables. Knows nothing about models or backends.

use ferrite_core::{Error, Result};

pub struct BlockManager {
    block_size: usize,
    n_blocks: usize,
    free: Vec<u32>,
}

impl BlockManager {
    pub fn new(n_blocks: usize, block_size: usize) -> Self {
        // Pop from the end: hand out low ids first (easier to read in dumps).
        BlockManager { block_size, n_blocks, free: (0..n_blocks as u32).rev().collect() }
    }
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }
    pub fn n_free(&self) -> usize {
        self.free.len()
    }
    /// Grows `table` so it can hold `tokens` tokens.
    pub fn reserve(&mut self, table: &mut Vec<u32>, tokens: usize) -> Result<()> {
        let need = tokens.div_ceil(self.block_size);
        if need > table.len() + self.free.len() {
            return Err(Error::InvalidInput(format!(
                "KV cache full: {tokens} tokens need {need} blocks of {}, {} free",
                self.block_size,
                self.free.len() + table.len()
            )));
        }
        while table.len() < need {
            table.push(self.free.pop().expect("checked above"));
        }
        Ok(())
    }
    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.free.append(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_and_release_account_for_every_block() {
        let mut m = BlockManager::new(4, 16);
        let mut a = Vec::new();
        let mut b = Vec::new();
        m.reserve(&mut a, 17).unwrap();
        assert_eq!(a.len(), 2);
        m.reserve(&mut b, 32).unwrap();
        assert_eq!(m.n_free(), 0);
        assert!(m.reserve(&mut a, 33).is_err());
        m.release(&mut a);
        assert_eq!(m.n_free(), 2);
        m.reserve(&mut b, 64).unwrap();
        assert_eq!(b.len(), 4);
        let mut all = b.clone();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3]);
    }
}
