//! A schema's numbers within bounds (`minimum`, `maximum` and their
//! exclusive forms) and multiples of a step (`multipleOf`), byte by byte:
//! every prefix accepted can still end at such a value.
//!
//! An integer's bounds and digits are integers. A `number`'s are integers
//! in units of 10^-[`DECIMALS`]: a bounded number is written with at most
//! that many fraction digits and no exponent (every value within its
//! bounds can be so written, to that precision). Either has fewer than 38
//! digits in all (a number's integer part fewer than 20), so that the
//! values each prefix can still reach form intervals that exact integer
//! arithmetic compares with the bounds, and bounds past that are clamped
//! to it. A schema's bounds are the doubles its numbers parse to, as
//! validators compare them.

use serde_json::{Map, Value};

use super::lex::Num;

/// Most fraction digits a bounded `number` may have.
pub(crate) const DECIMALS: u32 = 18;
/// A bounded value's magnitude, in its units, stays below this.
const LIMIT: u128 = 10u128.pow(38);
/// The keywords that bound numbers.
pub(crate) const BOUNDS: [&str; 4] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// A node's values, in units of 10^-scale: `lo..=hi`, multiples of `step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub lo: i128,
    pub hi: i128,
    pub step: i128,
}

impl Bounds {
    /// Whether some multiple of the step lies in `lo..=hi` (a range of
    /// magnitudes, or of values of either sign).
    pub(crate) fn holds_multiple(&self, lo: i128, hi: i128) -> bool {
        // (The multiple at or below `hi`, saturating: below i128's range
        // it is below any `lo` too.)
        lo <= hi && hi.saturating_sub(hi.rem_euclid(self.step)) >= lo
    }
}

/// Where a number of a bounded node has got: its sign, and its digits so far
/// (`mag`: the integer part's digits as an integer until the `.`; from
/// there, in units of 10^-scale, `frac` fraction digits read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NumPos {
    n: Num,
    neg: bool,
    frac: u8,
    mag: u128,
}

impl NumPos {
    /// A number's first byte (a digit or `-`) under `bounds` (in units of
    /// 10^-scale), if one of its completions lies within them.
    pub(crate) fn start(b: u8, scale: u32, bounds: Option<Bounds>) -> Option<NumPos> {
        let (n, neg, mag) = match b {
            b'-' => (Num::Minus, true, 0),
            b'0' => (Num::Zero, false, 0),
            b'1'..=b'9' => (Num::Int, false, (b - b'0') as u128),
            _ => return None,
        };
        let p = NumPos { n, neg, frac: 0, mag };
        p.may_end(scale, bounds).then_some(p)
    }

    /// After byte `b`, if it continues the number (an integer's: digits
    /// only; a bounded `number`'s: no exponent) and a completion still lies
    /// within `bounds`.
    pub(crate) fn step(self, b: u8, integer: bool, bounds: Option<Bounds>) -> Option<NumPos> {
        let next = self.n.step(b)?;
        let exponent = matches!(next, Num::Exp | Num::ExpSign | Num::ExpInt);
        if (integer && !matches!(next, Num::Zero | Num::Int)) || (bounds.is_some() && exponent) {
            return None;
        }
        if bounds.is_none() {
            return Some(NumPos { n: next, ..self });
        }
        let scale = if integer { 0 } else { DECIMALS };
        let digit = b.wrapping_sub(b'0') as u128;
        let (mag, frac) = match next {
            Num::Int => (self.mag.checked_mul(10).map(|m| m + digit).filter(|&m| m < int_limit(scale))?, 0),
            Num::Zero => (0, 0),
            Num::Dot => (self.mag * 10u128.pow(scale), 0),
            Num::Frac if u32::from(self.frac) < scale => {
                (self.mag + digit * 10u128.pow(scale - u32::from(self.frac) - 1), self.frac + 1)
            }
            _ => return None,
        };
        let p = NumPos { n: next, neg: self.neg, frac, mag };
        p.may_end(scale, bounds).then_some(p)
    }

    /// Whether the number may end here, within `bounds`.
    pub(crate) fn ends_within(&self, scale: u32, bounds: Option<Bounds>) -> bool {
        self.n.terminal()
            && bounds.is_none_or(|b| {
                let mag =
                    if matches!(self.n, Num::Zero | Num::Int) { scaled(self.mag, scale) } else { signed(self.mag) };
                let v = if self.neg { -mag } else { mag };
                (b.lo..=b.hi).contains(&v) && v % b.step == 0
            })
    }

    /// Whether some completion lies within `bounds`: the magnitudes still
    /// reachable are intervals, each checked for a multiple of the step
    /// among those the bounds allow for the number's sign.
    fn may_end(&self, scale: u32, bounds: Option<Bounds>) -> bool {
        let Some(b) = bounds else { return true };
        let (lo, hi) = (b.lo, b.hi);
        let (mlo, mhi) = if self.neg { (hi.saturating_neg().max(0), lo.saturating_neg()) } else { (lo.max(0), hi) };
        let meets = |first: i128, last: i128| b.holds_multiple(first.max(mlo), last.min(mhi));
        let unit = 10i128.pow(scale);
        match self.n {
            Num::Minus => b.holds_multiple(mlo, mhi),
            Num::Zero => meets(0, unit - 1),
            // After j more integer digits, the integer parts from mag 10^j
            // to (mag + 1) 10^j - 1 (`span` of them), fractions included.
            Num::Int => {
                let (mut int_part, mut span) = (self.mag, 1i128);
                loop {
                    let first = scaled(int_part, scale);
                    if first > mhi {
                        return false;
                    }
                    if meets(first, first + span * unit - 1) {
                        return true;
                    }
                    if int_part >= int_limit(scale) / 10 {
                        return false;
                    }
                    match (int_part.checked_mul(10), span.checked_mul(10)) {
                        (Some(i), Some(s)) => (int_part, span) = (i, s),
                        _ => return false,
                    }
                }
            }
            Num::Dot => meets(signed(self.mag), signed(self.mag) + unit - 1),
            Num::Frac => {
                let span = 10i128.pow(scale - u32::from(self.frac));
                meets(signed(self.mag), signed(self.mag) + span - 1)
            }
            Num::Exp | Num::ExpSign | Num::ExpInt => false,
        }
    }
}

/// The integer parts a bounded value may have are below this.
fn int_limit(scale: u32) -> u128 {
    LIMIT / 10u128.pow(scale)
}

/// A magnitude (below `LIMIT`) as an i128.
fn signed(mag: u128) -> i128 {
    mag as i128
}

/// An integer part's digits in units of 10^-scale.
fn scaled(mag: u128, scale: u32) -> i128 {
    signed(mag) * 10i128.pow(scale)
}

/// A node's bounds from `minimum`, `maximum` and their exclusive forms, in
/// units of 10^-scale, and its step from `multipleOf` (`None` without any,
/// or where the step takes every integer of an integer node): exact for
/// any decimal the schema writes, a bound between two units rounded inward.
pub(crate) fn bounds(m: &Map<String, Value>, scale: u32, at: &str) -> Result<Option<Bounds>, String> {
    let (mut lo, mut hi, mut any) = (i128::MIN, i128::MAX, false);
    for k in BOUNDS {
        let Some(v) = m.get(k) else { continue };
        any = true;
        let Value::Number(x) = v else { return Err(format!("{at}/{k}: must be a number")) };
        let (down, exact) = decimal_floor(&x.to_string(), scale);
        let up = if exact { down } else { down.saturating_add(1) };
        match k {
            "minimum" => lo = lo.max(up),
            "exclusiveMinimum" => lo = lo.max(if exact { up.saturating_add(1) } else { up }),
            "maximum" => hi = hi.min(down),
            _ => hi = hi.min(if exact { down.saturating_sub(1) } else { down }),
        }
    }
    // (Past what can be written, bounds are clamped to it.)
    let most = LIMIT as i128 - 1;
    if lo.max(-most) > hi.min(most) {
        let what = match scale {
            0 if lo <= hi => "integer of at most 38 digits".to_string(),
            0 => "integer".to_string(),
            _ => format!("number below 10^20 with at most {DECIMALS} decimals"),
        };
        return Err(format!("{at}: no {what} lies within its bounds"));
    }
    let (lo, hi) = (lo.max(-most), hi.min(most));
    let step = match m.get("multipleOf") {
        None => 1,
        Some(v) => step(v, scale).ok_or_else(|| {
            format!("{at}/multipleOf: must be a number above 0 with at most {DECIMALS} decimals and 20 digits")
        })?,
    };
    let b = Bounds { lo, hi, step };
    if !b.holds_multiple(lo, hi) {
        return Err(format!("{at}: no multiple of multipleOf lies within its bounds"));
    }
    let every_integer = scale == 0 && step == 1;
    Ok((any || (m.contains_key("multipleOf") && !every_integer)).then_some(b))
}

/// `multipleOf` in units of 10^-scale: the step between the values (in
/// those units) that are its multiples; `None` where it is no positive
/// number or has more than `DECIMALS` decimals or 20 digits.
fn step(v: &Value, scale: u32) -> Option<i128> {
    let Value::Number(x) = v else { return None };
    // Exactly, in units of 10^-DECIMALS: k = p 10^-DECIMALS.
    let (p, exact) = decimal_floor(&x.to_string(), DECIMALS);
    if !exact || p <= 0 || p >= LIMIT as i128 {
        return None;
    }
    // A value v (units of 10^-scale) is a multiple of k when v 10^(DECIMALS
    // - scale) is one of p: when v is one of p / gcd(p, 10^(DECIMALS - scale)).
    let (mut g, mut rest) = (p, 10i128.pow(DECIMALS - scale));
    while rest != 0 {
        (g, rest) = (rest, g % rest);
    }
    Some(p / g)
}

/// The largest multiple of 10^-scale at or below the JSON number `text`, in
/// those units (saturating far out), and whether it is `text` exactly.
fn decimal_floor(text: &str, scale: u32) -> (i128, bool) {
    let (neg, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exp) = match body.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.trim_start_matches('+').parse::<i64>().unwrap_or(0)),
        None => (body, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: Vec<u8> = int.bytes().chain(frac.bytes()).map(|b| b - b'0').collect();
    // The value is `digits` times 10^shift units: keep the digits that stay
    // whole, note whether any cut off is not zero.
    let shift = exp - frac.len() as i64 + i64::from(scale);
    let kept = (digits.len() as i64 + shift.min(0)).clamp(0, digits.len() as i64) as usize;
    let mut whole = digits[..kept].iter().fold(0i128, |w, &d| w.saturating_mul(10).saturating_add(i128::from(d)));
    if shift > 0 {
        whole = whole.saturating_mul(10i128.saturating_pow(shift.min(40) as u32));
    }
    let cut = digits[kept..].iter().any(|&d| d != 0);
    match (neg, cut) {
        (false, cut) => (whole, !cut),
        (true, false) => (-whole, true),
        // A negative value's floor is a unit further from zero.
        (true, true) => (-whole - 1, false),
    }
}

#[cfg(test)]
#[path = "number_tests.rs"]
mod tests;
