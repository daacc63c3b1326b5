//! Paged KV block accounting: fixed-size blocks, per-sequence block tables,
//! reference counts, and the prefix cache. Knows nothing about models or
//! backends.
//!
//! Prefix caching: once a block is full and its K/V computed, it may be
//! registered under a hash of its tokens chained with its parent block's hash,
//! so the hash names the whole prefix up to the block's end. A later sequence
//! whose prompt starts with the same tokens takes the block (reference count +1)
//! instead of recomputing it. A block whose count drops to zero keeps its
//! content and stays findable until the space is needed: free blocks without
//! content are handed out first, then cached ones, least recently freed first.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use ferrite_core::{Error, Result};

/// Hash of the empty prefix, the parent of every sequence's first block.
pub const ROOT_HASH: u64 = 0x6665_7272_6974_6500;

/// The chained hash naming `parent`'s prefix followed by `tokens`.
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    // DefaultHasher::new() is SipHash with fixed keys: stable within a process,
    // which is all a cache in memory needs.
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// What a cached block holds, kept to verify a hash match token by token.
struct Content {
    hash: u64,
    tokens: Box<[u32]>,
}

pub struct BlockManager {
    block_size: usize,
    refs: Vec<u32>,
    content: Vec<Option<Content>>,
    /// Free blocks with no registered content.
    plain: Vec<u32>,
    /// Free blocks with registered content, keyed by the tick they were freed.
    evictable: BTreeMap<u64, u32>,
    freed_at: Vec<u64>,
    tick: u64,
    /// Registered content hash -> block.
    cached: HashMap<u64, u32>,
}

impl BlockManager {
    pub fn new(n_blocks: usize, block_size: usize) -> Self {
        BlockManager {
            block_size,
            refs: vec![0; n_blocks],
            content: (0..n_blocks).map(|_| None).collect(),
            // Pop from the end: hand out low ids first (easier to read in dumps).
            plain: (0..n_blocks as u32).rev().collect(),
            evictable: BTreeMap::new(),
            freed_at: vec![0; n_blocks],
            tick: 0,
            cached: HashMap::new(),
        }
    }
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn n_blocks(&self) -> usize {
        self.refs.len()
    }
    /// Blocks no sequence holds (cached-but-unreferenced ones included).
    pub fn n_free(&self) -> usize {
        self.plain.len() + self.evictable.len()
    }
    /// Blocks currently registered in the prefix cache.
    pub fn n_cached(&self) -> usize {
        self.cached.len()
    }
    pub fn ref_count(&self, block: u32) -> u32 {
        self.refs[block as usize]
    }

    /// Whether `table` can grow to hold `tokens` tokens.
    pub fn can_reserve(&self, table: &[u32], tokens: usize) -> bool {
        tokens.div_ceil(self.block_size) <= table.len() + self.n_free()
    }

    /// Grows `table` with fresh blocks so it can hold `tokens` tokens.
    pub fn reserve(&mut self, table: &mut Vec<u32>, tokens: usize) -> Result<()> {
        if !self.can_reserve(table, tokens) {
            let need = tokens.div_ceil(self.block_size);
            return Err(Error::InvalidInput(format!(
                "KV cache full: {tokens} tokens need {need} blocks of {}, {} available",
                self.block_size,
                self.n_free() + table.len()
            )));
        }
        while table.len() < tokens.div_ceil(self.block_size) {
            let b = self.pop_free();
            self.refs[b as usize] = 1;
            table.push(b);
        }
        Ok(())
    }

    fn pop_free(&mut self) -> u32 {
        if let Some(b) = self.plain.pop() {
            return b;
        }
        let (_, b) = self.evictable.pop_first().expect("callers check n_free first");
        if let Some(c) = self.content[b as usize].take() {
            self.cached.remove(&c.hash);
        }
        b
    }

    /// Drops the table's references; blocks nobody else holds become free.
    /// Tail blocks are freed first so they are also evicted first: a prefix's
    /// head is the part most worth keeping.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        for b in table.drain(..).rev() {
            let r = &mut self.refs[b as usize];
            debug_assert!(*r > 0, "block {b} released more often than taken");
            *r = r.saturating_sub(1);
            if *r > 0 {
                continue;
            }
            if self.content[b as usize].is_some() {
                self.tick += 1;
                self.freed_at[b as usize] = self.tick;
                self.evictable.insert(self.tick, b);
            } else {
                self.plain.push(b);
            }
        }
    }

    /// The cached block holding `tokens` after the prefix named `parent`.
    pub fn lookup(&self, parent: u64, tokens: &[u32]) -> Option<(u32, u64)> {
        let hash = block_hash(parent, tokens);
        let &b = self.cached.get(&hash)?;
        let c = self.content[b as usize].as_ref()?;
        (*c.tokens == *tokens).then_some((b, hash))
    }

    /// Takes a reference to a cached block found by `lookup`.
    pub fn acquire(&mut self, block: u32) {
        let i = block as usize;
        if self.refs[i] == 0 {
            self.evictable.remove(&self.freed_at[i]);
        }
        self.refs[i] += 1;
    }

    /// Registers a full, computed block under `hash`. A no-op when another
    /// block already holds the same prefix (two requests computed it at once)
    /// or this block is already registered.
    pub fn register(&mut self, block: u32, hash: u64, tokens: &[u32]) {
        let i = block as usize;
        if self.content[i].is_some() || self.cached.contains_key(&hash) {
            return;
        }
        self.content[i] = Some(Content { hash, tokens: tokens.into() });
        self.cached.insert(hash, block);
    }

    /// Checks the accounting: every block is either free exactly once with no
    /// references, or referenced and not free; the cache map and block contents
    /// agree. Returns a description of the first inconsistency.
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut free = vec![false; self.refs.len()];
        for &b in self.plain.iter().chain(self.evictable.values()) {
            if std::mem::replace(&mut free[b as usize], true) {
                return Err(format!("block {b} is free twice"));
            }
        }
        for (b, &r) in self.refs.iter().enumerate() {
            if (r == 0) != free[b] {
                return Err(format!("block {b}: {r} references but free = {}", free[b]));
            }
        }
        for &b in self.plain.iter() {
            if self.content[b as usize].is_some() {
                return Err(format!("plain free block {b} has content"));
            }
        }
        for (&t, &b) in &self.evictable {
            if self.content[b as usize].is_none() || self.freed_at[b as usize] != t {
                return Err(format!("evictable block {b} has no content or a stale tick"));
            }
        }
        for (&h, &b) in &self.cached {
            if self.content[b as usize].as_ref().map(|c| c.hash) != Some(h) {
                return Err(format!("cache entry for block {b} does not match its content"));
            }
        }
        let registered = self.content.iter().filter(|c| c.is_some()).count();
        if registered != self.cached.len() {
            return Err(format!("{registered} blocks have content, {} are in the cache map", self.cached.len()));
        }
        Ok(())
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
        m.check().unwrap();
    }

    #[test]
    fn cached_blocks_are_shared_kept_when_free_and_evicted_last_and_lru() {
        let mut m = BlockManager::new(3, 2);
        let mut a = Vec::new();
        m.reserve(&mut a, 4).unwrap();
        let h0 = block_hash(ROOT_HASH, &[1, 2]);
        let h1 = block_hash(h0, &[3, 4]);
        m.register(a[0], h0, &[1, 2]);
        m.register(a[1], h1, &[3, 4]);
        assert_eq!(m.lookup(ROOT_HASH, &[1, 2]), Some((a[0], h0)));
        assert_eq!(m.lookup(ROOT_HASH, &[1, 3]), None);
        // Shared: a second holder.
        let mut b = Vec::new();
        m.acquire(a[0]);
        b.push(a[0]);
        assert_eq!(m.ref_count(a[0]), 2);
        let first = a.clone();
        m.release(&mut a);
        assert_eq!((m.n_free(), m.n_cached()), (2, 2));
        m.check().unwrap();
        // The plain block goes first, then the tail block (freed first).
        let mut c = Vec::new();
        m.reserve(&mut c, 2).unwrap();
        assert!(!first.contains(&c[0]));
        assert!(m.lookup(h0, &[3, 4]).is_some());
        m.reserve(&mut c, 4).unwrap();
        assert_eq!(c[1], first[1]);
        assert!(m.lookup(h0, &[3, 4]).is_none(), "evicted");
        assert!(m.lookup(ROOT_HASH, &[1, 2]).is_some(), "still held by b");
        m.release(&mut b);
        m.release(&mut c);
        assert_eq!(m.n_free(), 3);
        m.check().unwrap();
    }
}
