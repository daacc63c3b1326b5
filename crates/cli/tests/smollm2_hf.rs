//! The SmolLM2 GGUF converted to HF safetensors (scripts/convert_smollm2_hf.py,
//! F32 and BF16) runs through the HF path (config.json, safetensors, tokenizer.json)
//! and gives the same greedy text as the GGUF run in full precision (F32). BF16
//! rounds every weight (logits move by ~0.1), which can flip a near-tie and send a
//! free-running continuation elsewhere; so BF16 is checked teacher-forced on the
//! GGUF's greedy tokens with the near-tie rule of the llama.cpp goldens.

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

/// (prompt ids, generated ids, generated text) per prompt.
fn greedy(model: &str) -> Vec<(Vec<u32>, Vec<u32>, String)> {
    let source = resolve(model).unwrap();
    let ck = Checkpoint::open(&source).unwrap();
    let tok = match (&source, &ck) {
        (_, Checkpoint::Gguf(g)) => Tokenizer::from_gguf(g).unwrap(),
        (ModelSource::HfDir(d), _) => Tokenizer::from_hf_dir(d).unwrap(),
        _ => unreachable!(),
    };
    let lm = load_causal_lm(CpuBackend::F32, &ck, &mut |_, _| {}).unwrap();
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
                format: None,
            };
            let g = generate(&mut runner, &tok, &req, &mut |_| true).unwrap();
            (req.prompt, g.tokens, g.text)
        })
        .collect()
}

#[test]
fn hf_f32_matches_gguf_greedy_text() {
    let gguf = greedy(model_path("smollm2.gguf").to_str().unwrap());
    let hf = greedy(model_path("smollm2-hf-f32").to_str().unwrap());
    for (i, (g, h)) in gguf.iter().zip(&hf).enumerate() {
        assert_eq!(g.0, h.0, "prompt {i} tokenizes differently");
        assert!(!g.2.is_empty(), "prompt {i}: empty continuation");
        assert_eq!(g.2, h.2, "prompt {i} greedy text differs");
    }
}

#[test]
fn hf_bf16_agrees_with_gguf_teacher_forced() {
    let gguf = greedy(model_path("smollm2.gguf").to_str().unwrap());
    let mut runner = runner_for(model_path("smollm2-hf-bf16").to_str().unwrap(), 256);
    let mut flips = 0;
    for (i, (prompt, cont, _)) in gguf.iter().enumerate() {
        let all: Vec<u32> = prompt.iter().chain(cont).copied().collect();
        let logits = score(&mut runner, &all, 64);
        for (j, &want) in cont.iter().enumerate() {
            let row = &logits[prompt.len() - 1 + j];
            let top = argmax(row);
            let gap = row[top] - row[want as usize];
            assert!(gap <= 0.5, "prompt {i} step {j}: bf16 top {top} beats the GGUF's {want} by {gap}");
            flips += (top != want as usize) as usize;
        }
    }
    eprintln!("bf16: {flips} near-tie flips");
}
