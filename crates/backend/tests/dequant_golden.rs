//! Dequantization of every block type against the `gguf` Python package (fixtures
//! from scripts/golden_dequant.py: random blocks with sane scales).

use ferrite_backend::quant::dequantize_row;
use ferrite_core::DType;

fn fixture(name: &str) -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/dequant").join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn every_block_type_matches_gguf_py() {
    let types = [
        ("F16", DType::F16),
        ("BF16", DType::BF16),
        ("Q4_0", DType::Q4_0),
        ("Q4_1", DType::Q4_1),
        ("Q5_0", DType::Q5_0),
        ("Q5_1", DType::Q5_1),
        ("Q8_0", DType::Q8_0),
        ("Q4_K", DType::Q4K),
        ("Q5_K", DType::Q5K),
        ("Q6_K", DType::Q6K),
    ];
    for (name, dtype) in types {
        let fx = fixture(&format!("{name}.json"));
        let raw = hex(fx["raw_hex"].as_str().unwrap());
        let want: Vec<f32> = fx["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert!(!want.is_empty());
        let mut got = vec![0f32; want.len()];
        dequantize_row(dtype, &raw, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w || (g - w).abs() <= 1e-6 * w.abs().max(1.0), "{name}[{i}]: {g} vs {w}");
        }
    }
}

#[test]
fn wrong_byte_count_is_an_error() {
    let mut out = vec![0f32; 64];
    assert!(dequantize_row(DType::Q4K, &[0u8; 144], &mut out).is_err());
    assert!(dequantize_row(DType::Q8_0, &[0u8; 33], &mut out[..32]).is_err());
}
