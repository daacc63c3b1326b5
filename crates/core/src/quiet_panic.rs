//! Some third-party code panics on malformed input instead of returning an
//! error (the tokenizers crate on a few corrupt tokenizer.json files). Calls
//! into it go through [`catch_panic`], so that the user sees one error line,
//! not a panic message and a crash.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Set while this thread runs a guarded call: its panics are caught, so the
    /// hook stays silent for them.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`; a panic inside it becomes `Err(its message)`, printed by no one.
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(Cell::get) {
                default(info)
            }
        }));
    });
    let outer = GUARDED.with(|g| g.replace(true));
    let out = panic::catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(outer));
    out.map_err(|payload| {
        let text =
            payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        text.unwrap_or("unknown failure").to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::catch_panic;

    #[test]
    fn a_panic_becomes_its_message_and_a_value_passes() {
        assert_eq!(catch_panic(|| 7), Ok(7));
        let err = catch_panic(|| -> u32 { panic!("no entry found for key {}", 3) });
        assert_eq!(err, Err("no entry found for key 3".to_string()));
        // Nested guards restore the outer state.
        assert_eq!(catch_panic(|| catch_panic(|| -> () { panic!("inner") }).is_err()), Ok(true));
    }
}
