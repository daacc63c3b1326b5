use super::*;

#[test]
fn decimals_floor_exactly() {
    let unit = 10i128.pow(DECIMALS);
    assert_eq!(decimal_floor("0.1", DECIMALS), (unit / 10, true));
    assert_eq!(decimal_floor("-2.5", DECIMALS), (-5 * unit / 2, true));
    assert_eq!(decimal_floor("1e-7", DECIMALS), (unit / 10_000_000, true));
    assert_eq!(decimal_floor("1.5E+3", 0), (1500, true));
    assert_eq!(decimal_floor("2.5", 0), (2, false));
    assert_eq!(decimal_floor("-2.5", 0), (-3, false));
    assert_eq!(decimal_floor("1e-20", DECIMALS), (0, false));
    assert_eq!(decimal_floor("-1e-20", DECIMALS), (-1, false));
    assert_eq!(decimal_floor("1e300", DECIMALS), (i128::MAX, true));
    assert_eq!(decimal_floor("0", DECIMALS), (0, true));
    assert_eq!(decimal_floor("-0.0", DECIMALS), (0, true));
}

/// The bounds of a schema fragment, in `scale`'s units.
fn bounds_of(doc: serde_json::Value, scale: u32) -> Result<Option<Bounds>, String> {
    bounds(doc.as_object().unwrap(), scale, "#")
}

#[test]
fn bounds_round_inward_and_refuse_empty_ranges() {
    let unit = 10i128.pow(DECIMALS);
    let b = |doc| bounds_of(doc, DECIMALS).unwrap().map(|b| (b.lo, b.hi)).unwrap();
    assert_eq!(b(serde_json::json!({"minimum": 0, "maximum": 1})), (0, unit));
    assert_eq!(b(serde_json::json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1})), (1, unit - 1));
    assert_eq!(b(serde_json::json!({"exclusiveMinimum": 1e-30})), (1, 10i128.pow(38) - 1));
    assert_eq!(
        bounds_of(serde_json::json!({"minimum": 2.5, "maximum": 2.9}), 0).unwrap_err(),
        "#: no integer lies within its bounds"
    );
    assert!(bounds_of(serde_json::json!({"minimum": 1, "exclusiveMaximum": 1}), DECIMALS).is_err());
    assert!(bounds_of(serde_json::json!({"minimum": "1"}), DECIMALS).is_err());
    assert_eq!(bounds_of(serde_json::json!({"title": "x"}), DECIMALS), Ok(None));
    // Bounds past what can be written: clamped, or nothing within.
    for doc in [serde_json::json!({"minimum": 1e20}), serde_json::json!({"maximum": -1e25})] {
        assert!(bounds_of(doc, DECIMALS).unwrap_err().contains("below 10^20"));
    }
    assert!(bounds_of(serde_json::json!({"minimum": 1e39}), 0).unwrap_err().contains("38 digits"));
    let most = 10i128.pow(38) - 1;
    assert_eq!(b(serde_json::json!({"maximum": 1e300, "minimum": -1e300})), (-most, most));
    // The largest integer part and the most digits may still be written, no more.
    let b = bounds_of(serde_json::json!({"minimum": 0}), DECIMALS).unwrap();
    let walk = |text: &str, scale: u32, integer: bool, b| {
        let bytes = text.as_bytes();
        let mut p = NumPos::start(bytes[0], scale, b);
        for &c in &bytes[1..] {
            p = p.and_then(|p| p.step(c, integer, b));
        }
        p.is_some_and(|p| p.ends_within(scale, b))
    };
    assert!(walk(&"9".repeat(20), DECIMALS, false, b) && !walk(&"9".repeat(21), DECIMALS, false, b));
    let b = bounds_of(serde_json::json!({"maximum": 1e300}), 0).unwrap();
    assert!(walk(&"9".repeat(38), 0, true, b) && !walk(&"1".repeat(39), 0, true, b));
    assert!(walk(&format!("-{}", "9".repeat(38)), 0, true, b));
}

/// Whether `text` is a JSON number whose value (as a float) is within `lo..=hi`.
fn valid(text: &[u8], lo: f64, hi: f64) -> bool {
    let t = std::str::from_utf8(text).unwrap();
    serde_json::from_str::<serde_json::Number>(t).is_ok() && (lo..=hi).contains(&t.parse::<f64>().unwrap())
}

/// Every string of up to 6 bytes over `alphabet`, walked under `b`: one
/// that some `valid` string extends is accepted, and an accepted one may
/// end exactly when it is `valid`.
fn check_prefixes(alphabet: &[u8], scale: u32, integer: bool, b: Option<Bounds>, valid: impl Fn(&[u8]) -> bool) {
    let mut all: Vec<Vec<u8>> = Vec::new();
    let mut level = vec![Vec::new()];
    for _ in 0..6 {
        level = level.iter().flat_map(|s: &Vec<u8>| alphabet.iter().map(move |&c| [&s[..], &[c]].concat())).collect();
        all.extend(level.iter().cloned());
    }
    let good: Vec<&Vec<u8>> = all.iter().filter(|t| valid(t)).collect();
    assert!(good.len() > 1, "{b:?}");
    for s in &all {
        let mut p = NumPos::start(s[0], scale, b);
        for &c in &s[1..] {
            p = p.and_then(|p| p.step(c, integer, b));
        }
        let text = String::from_utf8_lossy(s);
        if good.iter().any(|t| t.starts_with(s)) {
            assert!(p.is_some(), "{b:?}: {text} refused");
        }
        if let Some(p) = p {
            assert_eq!(p.ends_within(scale, b), valid(s), "{b:?}: {text}");
        }
    }
}

/// Every string of up to 6 bytes over an alphabet of number bytes, against
/// bounds.
#[test]
fn prefixes_of_numbers_within_are_accepted_and_end_exactly() {
    let cases = [(0.25, 1.5), (-1.0, -0.125), (-0.5, 0.5), (3.0, 3.0), (0.1, 0.1), (-12.0, 40.0), (0.0, 0.0)];
    for (lo, hi) in cases {
        let b = bounds_of(serde_json::json!({"minimum": lo, "maximum": hi}), DECIMALS).unwrap();
        check_prefixes(b"-012359.", DECIMALS, false, b, |t| valid(t, lo, hi));
    }
}

/// A bounded number takes no exponent and at most DECIMALS fraction
/// digits; an unbounded one any.
#[test]
fn bounded_numbers_are_plain_decimals() {
    let b = bounds_of(serde_json::json!({"minimum": 0, "maximum": 1}), DECIMALS).unwrap();
    let walk = |text: &str, b| {
        let bytes = text.as_bytes();
        let mut p = NumPos::start(bytes[0], DECIMALS, b);
        for &c in &bytes[1..] {
            p = p.and_then(|p| p.step(c, false, b));
        }
        p
    };
    assert!(walk("0.1e", b).is_none());
    assert!(walk("0.1e", None).is_some());
    assert!(walk(&format!("0.{}", "1".repeat(DECIMALS as usize)), b).is_some());
    assert!(walk(&format!("0.{}", "1".repeat(DECIMALS as usize + 1)), b).is_none());
    // An integer node takes digits only.
    assert!(NumPos::start(b'1', 0, None).unwrap().step(b'.', true, None).is_none());
}

/// `multipleOf` as a step in a node's units: a number's exactly, an
/// integer's the step between the integers that are multiples (of 2.5:
/// 5); refused where it is no positive decimal of at most 18 places.
#[test]
fn steps_in_units() {
    let step = |doc, scale| bounds_of(doc, scale).map(|b| b.map(|b| b.step));
    let unit = 10i128.pow(DECIMALS);
    assert_eq!(step(serde_json::json!({"multipleOf": 0.01}), DECIMALS), Ok(Some(unit / 100)));
    assert_eq!(step(serde_json::json!({"multipleOf": 2.5}), 0), Ok(Some(5)));
    assert_eq!(step(serde_json::json!({"multipleOf": 3}), 0), Ok(Some(3)));
    assert_eq!(step(serde_json::json!({"multipleOf": 0.5}), 0), Ok(None), "every integer");
    assert_eq!(step(serde_json::json!({"multipleOf": 4, "minimum": 1}), 0), Ok(Some(4)));
    for bad in [serde_json::json!(0), serde_json::json!(-2), serde_json::json!("2"), serde_json::json!(1e-19)] {
        assert!(bounds_of(serde_json::json!({"multipleOf": bad}), 0).unwrap_err().contains("multipleOf"), "{bad}");
    }
    // A number's step of one unit still bounds it (18 decimals at most).
    assert_eq!(step(serde_json::json!({"multipleOf": 1e-18}), DECIMALS), Ok(Some(1)));
    // Steps near the largest magnitudes: no overflow, nothing within.
    let far = serde_json::json!({"multipleOf": 9e19, "maximum": -9.5e19});
    assert!(bounds_of(far, DECIMALS).unwrap_err().contains("no multiple"));
    let none = bounds_of(serde_json::json!({"minimum": 1, "maximum": 4, "multipleOf": 5}), 0).unwrap_err();
    assert!(none.contains("no multiple"), "{none}");
    assert!(bounds_of(serde_json::json!({"minimum": -6, "maximum": -4, "multipleOf": 5}), 0).is_ok());
}

/// Whether `text` is a number whose value is a multiple of `k` (both with
/// at most 6 decimals, compared exactly) within `lo..=hi`.
fn valid_multiple(text: &[u8], lo: f64, hi: f64, k: f64) -> bool {
    let micro = |t: &str| -> Option<i128> {
        let (int, frac) = t.split_once('.').unwrap_or((t, ""));
        let digits = format!("{}{frac:0<6}", int.trim_start_matches('-'));
        let v: i128 = digits.parse().ok()?;
        Some(if t.starts_with('-') { -v } else { v })
    };
    valid(text, lo, hi) && micro(std::str::from_utf8(text).unwrap()).unwrap() % micro(&k.to_string()).unwrap() == 0
}

/// As above, with `multipleOf`: over every string of up to 6 bytes, a
/// prefix of a valid number is accepted, and an accepted one ends exactly
/// at a multiple within the bounds.
#[test]
fn prefixes_of_multiples_are_accepted_and_end_exactly() {
    let cases = [(0.0, 100.0, 0.25, false), (-3.0, 3.0, 1.5, false), (-50.0, 50.0, 7.0, true), (-1e9, 1e9, 3.0, true)];
    for (lo, hi, k, integer) in cases {
        let alphabet: &[u8] = if integer { b"-01379" } else { b"-0125.7" };
        let scale = if integer { 0 } else { DECIMALS };
        let b = bounds_of(serde_json::json!({"minimum": lo, "maximum": hi, "multipleOf": k}), scale).unwrap();
        check_prefixes(alphabet, scale, integer, b, |t| valid_multiple(t, lo, hi, k));
    }
}
