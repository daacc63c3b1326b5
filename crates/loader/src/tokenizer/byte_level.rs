//! The GPT-2 byte-level alphabet: each of the 256 byte values is shown as one
//! printable character so that BPE can work on text. Printable Latin-1 bytes
//! stand for themselves; the other 68 are moved to U+0100.. in byte order.

use std::sync::OnceLock;

struct Tables {
    to_char: [char; 256],
    /// Indexed by code point; only U+0000..U+0143 are ever used.
    to_byte: [Option<u8>; 0x144],
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let mut to_char = ['\0'; 256];
        let mut to_byte = [None; 0x144];
        let mut shifted = 0u32;
        for b in 0..256u32 {
            let cp = if printable(b) {
                b
            } else {
                shifted += 1;
                255 + shifted
            };
            // Both ranges are valid scalar values below the surrogates.
            to_char[b as usize] = char::from_u32(cp).unwrap_or('\0');
            to_byte[cp as usize] = Some(b as u8);
        }
        Tables { to_char, to_byte }
    })
}

/// The character that stands for byte `b`.
pub(crate) fn byte_to_char(b: u8) -> char {
    tables().to_char[b as usize]
}

/// The byte a character stands for, if it is part of the alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    tables().to_byte.get(c as usize).copied().flatten()
}

/// Byte-level encoding of `s`: one alphabet character per byte.
pub(crate) fn encode(s: &[u8]) -> String {
    s.iter().map(|&b| byte_to_char(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
    }
}
