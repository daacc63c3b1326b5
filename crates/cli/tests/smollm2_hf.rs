//! The SmolLM2 GGUF converted to HF safetensors (scripts/convert_smollm2_hf.py,
//! F32 and BF16) runs through the HF path (config.json, safetensors, tokenizer.json)
//! and gives the same greedy text as the GGUF run in full precision.

mod common;
use common::*;
use ferrite_backend::cpu::CpuBackend;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{generate, GenerateRequest, Runner};
use ferrite_loader::source::{resolve, ModelSource};
use ferrite_loader::tokenizer::Tokenizer;
use ferrite_models::{load_causal_lm, Checkpoint, KvDtype};

const PROMPTS: [&str; 4] = [
    "The history of the printing press begins",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Three facts about the Moon:\n1.",
    "Once upon a time, in a small village by the sea,",
];

fn greedy(model: &str) -> Vec<(Vec<u32>, String)> {
    let source = resolve(model).unwrap();
    let ck = Checkpoint::open(&source).unwrap();
    let tok = match (&source, &ck) {
        (_, Checkpoint::Gguf(g)) => Tokenizer::from_gguf(g).unwrap(),
        (ModelSource::HfDir(d), _) => Tokenizer::from_hf_dir(d).unwrap(),
        _ => unreachable!(),
    };
    let lm = load_causal_lm(CpuBackend, &ck, &mut |_, _| {}).unwrap();
    // Full precision: f32 KV cache for every format.
    let mut runner = Runner::new(lm, 256, 16, KvDtype::F32).unwrap();
    PROMPTS
        .iter()
        .map(|p| {
            let req = GenerateRequest {
                prompt: tok.encode(p, true).unwrap(),
                sampling: SamplingParams::greedy(),
                max_tokens: 24,
                stop: vec![],
                stop_ids: vec![],
                ignore_eos: false,
            };
            let g = generate(&mut runner, &tok, &req, &mut |_| true).unwrap();
            (req.prompt, g.text)
        })
        .collect()
}

#[test]
fn hf_f32_and_bf16_match_gguf_greedy_text() {
    let gguf = greedy(model_path("smollm2.gguf").to_str().unwrap());
    for dir in ["smollm2-hf-f32", "smollm2-hf-bf16"] {
        let hf = greedy(model_path(dir).to_str().unwrap());
        for (i, ((gp, gt), (hp, ht))) in gguf.iter().zip(&hf).enumerate() {
            assert_eq!(gp, hp, "{dir}: prompt {i} tokenizes differently");
            assert_eq!(gt, ht, "{dir}: prompt {i} greedy text differs");
        }
    }
    eprintln!("{:#?}", gguf.iter().map(|g| &g.1).collect::<Vec<_>>());
}
