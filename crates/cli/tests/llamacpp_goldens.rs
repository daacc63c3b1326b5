//! Fidelity against llama.cpp (fixtures from scripts/golden_llamacpp.py):
//! teacher-forced top-1 agreement on llama.cpp's own greedy continuations, and
//! perplexity by llama.cpp's method.
//!
//! llama.cpp generated its continuations one token at a time; at a few positions
//! its one-token path and its own batched evaluation of the same tokens pick
//! different top tokens (the fixture lists them as
//! `batched_argmax_mismatch_positions`). There llama.cpp contradicts itself by
//! more than the near-tie margin (its 8-bit activations and f16 cache move logits
//! by up to ~2), so we accept either of its answers: our top must then equal its
//! batched top. Everywhere else the near-tie rule applies unchanged.

mod common;
use common::*;

/// Largest gap allowed between our top logit and our logit for llama.cpp's token.
const NEAR_TIE: f32 = 0.5;

fn teacher_forced(model_file: &str, fixture_name: &str) {
    let fx = read_json(fixture_name);
    let mut runner = runner_for(model_path(model_file).to_str().unwrap(), 512);
    let (mut checked, mut ties, mut self_contradictions) = (0, 0, 0);
    for p in fx["prompts"].as_array().unwrap() {
        let prompt = ids(&p["prompt_ids"]);
        let cont = ids(&p["continuation_ids"]);
        let unstable = ids(&p["batched_argmax_mismatch_positions"]);
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
        let logits = score(&mut runner, &all, 512);
        for (i, &want) in cont.iter().enumerate() {
            let row = &logits[prompt.len() - 1 + i];
            let top = argmax(row);
            let gap = row[top] - row[want as usize];
            if gap > NEAR_TIE && unstable.contains(&(i as u32)) {
                let batched_top = p["top5"][i][0][0].as_u64().unwrap() as usize;
                assert_eq!(top, batched_top, "{model_file} {:?} step {i}: neither of llama.cpp's answers", p["name"]);
                self_contradictions += 1;
                checked += 1;
                continue;
            }
            assert!(
                gap <= NEAR_TIE,
                "{model_file} prompt {:?} step {i}: our top {top} ({}) beats llama.cpp's {want} ({}) by {gap}",
                p["name"],
                row[top],
                row[want as usize]
            );
            checked += 1;
            if top != want as usize {
                ties += 1;
            }
        }
    }
    assert_eq!(checked, 320);
    assert!(self_contradictions <= 3, "{self_contradictions} positions needed llama.cpp's batched answer");
    eprintln!(
        "{model_file}: {checked} positions, {ties} near-ties where the top token differs, \
         {self_contradictions} where llama.cpp contradicts itself"
    );
}

#[test]
fn smollm2_teacher_forced_matches_llamacpp() {
    teacher_forced("smollm2.gguf", "llamacpp/smollm2_greedy.json");
}

#[test]
fn gemma3_teacher_forced_matches_llamacpp() {
    teacher_forced("gemma3-270m.gguf", "llamacpp/gemma3-270m_greedy.json");
}

fn perplexity_close(model_file: &str) {
    let fx = read_json("llamacpp/perplexity.json");
    let want = fx["ppl"][model_file].as_f64().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["perplexity", model_path(model_file).to_str().unwrap(), "--ctx", "256", "--file"])
        .arg(fixture("prose/english.txt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let got: f64 = last.strip_prefix("perplexity: ").unwrap().parse().unwrap();
    let rel = (got - want).abs() / want;
    eprintln!("{model_file}: perplexity {got:.4} vs llama.cpp {want:.4} ({:.2}%)", rel * 100.0);
    assert!(rel < 0.03, "{model_file}: perplexity {got} vs llama.cpp {want}");
}

#[test]
fn smollm2_perplexity_within_3_percent() {
    perplexity_close("smollm2.gguf");
}

#[test]
fn gemma3_perplexity_within_3_percent() {
    perplexity_close("gemma3-270m.gguf");
}
