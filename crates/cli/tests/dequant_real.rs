//! Real tensors of the demo models dequantize exactly as the `gguf` Python package
//! does (first rows of one tensor per type per model, scripts/golden_dequant.py).

mod common;
use common::*;
use ferrite_loader::gguf::GgufFile;

#[test]
fn real_tensor_rows_match_gguf_py() {
    let fx = read_json("dequant/real.json");
    let entries = fx["entries"].as_array().unwrap();
    assert!(entries.len() >= 8);
    for e in entries {
        let model = e["model"].as_str().unwrap();
        let g = GgufFile::open(&model_path(model)).unwrap();
        let name = e["tensor"].as_str().unwrap();
        let t = g.tensor(name).unwrap();
        assert_eq!(t.dtype.name(), e["type"].as_str().unwrap(), "{model} {name}");
        let row_len = e["row_len"].as_u64().unwrap() as usize;
        let rows = e["rows"].as_array().unwrap();
        let row_bytes = row_len / t.dtype.block_size() * t.dtype.block_bytes();
        let data = g.tensor_data(t);
        for (r, want) in rows.iter().enumerate() {
            let want: Vec<f32> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            let mut got = vec![0f32; row_len];
            ferrite_backend::quant::dequantize_row(t.dtype, &data[r * row_bytes..(r + 1) * row_bytes], &mut got)
                .unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(a == b || (a - b).abs() <= 1e-6 * b.abs().max(1.0), "{model} {name} row {r}[{i}]: {a} vs {b}");
            }
        }
    }
}
