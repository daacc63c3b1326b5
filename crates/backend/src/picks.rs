//! Tokens drawn on a device, and the next step fed from them there.
//!
//! A decode step's one host turn is reading its picks back: the host waits
//! for them, then builds and launches the next step. Where a backend feeds
//! tokens itself, the next step is launched first, its token ids naming the
//! picks still on the device ([`FED_TOKEN`]), and the host reads the picks
//! while that step runs ([`Picks::wait`]).

use ferrite_core::Result;

/// Token ids from here up are fed on the device: `FED_TOKEN + j` is the
/// token drawn for row `j` by the backend's last sampling launch.
pub const FED_TOKEN: u32 = 0x8000_0000;

/// Rows of a sampling launch that fed ids may name: a launch of more rows
/// leaves its picks where the next step cannot read them.
pub const MAX_FED_ROWS: usize = 16384;

/// The fed id of the token drawn for row `j` of the last sampling launch.
pub fn fed(j: usize) -> u32 {
    FED_TOKEN | j as u32
}

/// Whether `id` is a fed id, and the row it names.
pub fn fed_row(id: u32) -> Option<usize> {
    (id >= FED_TOKEN).then(|| (id - FED_TOKEN) as usize)
}

type Later = Box<dyn FnOnce() -> Result<Vec<(u32, f32)>> + Send>;

/// A sampling launch's (token, logprob) per row: ready, or still on the way
/// back from the device.
pub struct Picks(Inner);

enum Inner {
    Ready(Vec<(u32, f32)>),
    Later(Later),
}

impl Picks {
    pub fn ready(picks: Vec<(u32, f32)>) -> Picks {
        Picks(Inner::Ready(picks))
    }

    /// Picks that `wait` gets by calling `f` (which blocks until they are back).
    pub fn later(f: impl FnOnce() -> Result<Vec<(u32, f32)>> + Send + 'static) -> Picks {
        Picks(Inner::Later(Box::new(f)))
    }

    /// The picks, once the device has them back on the host.
    pub fn wait(self) -> Result<Vec<(u32, f32)>> {
        match self.0 {
            Inner::Ready(p) => Ok(p),
            Inner::Later(f) => f(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fed_ids_name_their_row() {
        assert_eq!(fed_row(fed(0)), Some(0));
        assert_eq!(fed_row(fed(37)), Some(37));
        assert_eq!(fed_row(FED_TOKEN - 1), None);
        assert_eq!(Picks::later(|| Ok(vec![(4, -0.5)])).wait().unwrap(), vec![(4, -0.5)]);
    }
}
