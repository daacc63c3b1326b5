//! Host bytes shared with their owner (usually a memory-mapped model file), so
//! weights can stay in the page cache instead of being copied.

use std::ops::Range;
use std::sync::Arc;

#[derive(Clone)]
pub struct HostBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl HostBytes {
    /// `range` must lie inside `owner`; callers construct it from validated offsets.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> HostBytes {
        assert!(range.end <= (*owner).as_ref().len(), "HostBytes range out of bounds");
        HostBytes { owner, range }
    }
    pub fn from_vec(v: Vec<u8>) -> HostBytes {
        let len = v.len();
        HostBytes { owner: Arc::new(v), range: 0..len }
    }
    /// A sub-range of these bytes, sharing the owner.
    pub fn sub(&self, range: Range<usize>) -> HostBytes {
        assert!(range.end <= self.range.len(), "HostBytes sub-range out of bounds");
        HostBytes { owner: self.owner.clone(), range: self.range.start + range.start..self.range.start + range.end }
    }
    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
    pub fn len(&self) -> usize {
        self.range.len()
    }
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}
