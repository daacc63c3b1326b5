//! HF checkpoints against HF transformers: tiny random checkpoints of each family
//! (scripts/golden_hf.py; float32, eager attention) must give the same logits at
//! every position, with both the transformers-5 config.json and the older format.

mod common;
use common::*;

const TOL: f32 = 1e-3;

fn check(name: &str, config_file: &str) {
    let src = fixture(&format!("hf/{name}"));
    // Run from a scratch copy so the older config can stand in as config.json.
    let dir = std::env::temp_dir().join(format!("ferrite-hf-{name}-{config_file}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    std::fs::copy(src.join(config_file), dir.join("config.json")).unwrap();
    let fx = read_json(&format!("hf/{name}/logits.json"));
    let input = ids(&fx["input_ids"]);
    let mut runner = runner_for(dir.to_str().unwrap(), 64);
    // Chunks of 7 also exercise chunked prefill against the cache.
    let got = score(&mut runner, &input, 7);
    let want = fx["logits"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    let mut worst = 0f32;
    for (pos, (g, w)) in got.iter().zip(want).enumerate() {
        let w: Vec<f32> = w.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(&w) {
            let d = (a - b).abs();
            worst = worst.max(d);
            assert!(d < TOL, "{name} ({config_file}) position {pos}: {a} vs {b}");
        }
    }
    eprintln!("{name} ({config_file}): max |diff| {worst:e}");
    std::fs::remove_dir_all(&dir).ok();
}

macro_rules! hf_test {
    ($fn:ident, $name:literal) => {
        #[test]
        fn $fn() {
            check($name, "config.json");
            check($name, "config.v4.json");
        }
    };
}

hf_test!(qwen2_matches_transformers, "qwen2");
hf_test!(qwen3_tied_matches_transformers, "qwen3_tied");
hf_test!(qwen3_untied_matches_transformers, "qwen3_untied");
hf_test!(llama3_matches_transformers, "llama3");
hf_test!(mistral_matches_transformers, "mistral");
hf_test!(gemma3_matches_transformers, "gemma3");
