//! Token texts with a text -> id lookup.
//!
//! The lookup is an open-addressing table of ids that hashes the texts in
//! place, so a 262k-token vocabulary costs no second copy of every string and
//! builds in a fraction of the time a `HashMap<String, u32>` takes.

/// FxHash-style mixing, 8 bytes at a time: fast, and good enough for keys an
/// attacker does not choose (the vocabulary is fixed; lookups only probe).
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    for &b in chunks.remainder() {
        h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
    }
    // Fold the high bits down: the table index uses the low ones.
    h ^ (h >> 29)
}

const EMPTY: u32 = u32::MAX;

pub(crate) struct Vocab {
    texts: Vec<String>,
    slots: Vec<u32>,
    mask: usize,
}

impl Vocab {
    /// Builds the lookup; a text that occurs twice is returned as `Err((first, second))`.
    pub fn new(texts: Vec<String>) -> Result<Vocab, (u32, u32)> {
        let size = (texts.len() * 2).next_power_of_two().max(16);
        let mut vocab = Vocab { texts, slots: vec![EMPTY; size], mask: size - 1 };
        for id in 0..vocab.texts.len() {
            let text = vocab.texts[id].as_bytes();
            let mut at = hash(text) as usize & vocab.mask;
            loop {
                match vocab.slots[at] {
                    EMPTY => {
                        vocab.slots[at] = id as u32;
                        break;
                    }
                    other if vocab.texts[other as usize].as_bytes() == text => return Err((other, id as u32)),
                    _ => at = (at + 1) & vocab.mask,
                }
            }
        }
        Ok(vocab)
    }

    pub fn get(&self, text: &str) -> Option<u32> {
        let mut at = hash(text.as_bytes()) as usize & self.mask;
        loop {
            match self.slots[at] {
                EMPTY => return None,
                id if self.texts[id as usize] == text => return Some(id),
                _ => at = (at + 1) & self.mask,
            }
        }
    }

    pub fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    pub fn texts(&self) -> &[String] {
        &self.texts
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Vocab;

    #[test]
    fn finds_every_token_and_rejects_duplicates() {
        let texts: Vec<String> = (0..1000).map(|i| format!("t{i}")).chain(["".into(), "▁a".into()]).collect();
        let v = Vocab::new(texts.clone()).unwrap();
        for (i, t) in texts.iter().enumerate() {
            assert_eq!(v.get(t), Some(i as u32));
        }
        assert_eq!(v.get("nope"), None);
        assert_eq!(v.text(1001), Some("▁a"));
        assert_eq!(Vocab::new(vec!["a".into(), "b".into(), "a".into()]).err(), Some((0, 2)));
    }
}
