//! `ferrite`: run, serve and benchmark transformer models.

/// The "path" of errors writing a command's output.
const STDOUT: &str = "standard output";

/// `println!` for a command's output: a failed write is an error for `?`,
/// and a closed pipe (`| head`) ends the command quietly (see `main`).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err(|e| ferrite_core::Error::io(crate::STDOUT, e))
    }};
}

/// `print!` the same way.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($arg)*).map_err(|e| ferrite_core::Error::io(crate::STDOUT, e))
    }};
}

mod alloc;
mod bench;
mod bench_serve;
mod chat;
mod chat_input;
mod cores;
mod device;
mod draws;
mod embed;
mod gpu_check;
mod inspect;
mod load;
mod perplexity;
mod run;
mod score;
mod serve;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ferrite_engine::sampling::SamplingParams;

#[derive(Parser)]
#[command(
    name = "ferrite",
    version,
    about = "Run, serve and benchmark transformer models (GGUF and Hugging Face safetensors) on CPUs and NVIDIA GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options every command that loads a model shares.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// A .gguf file, an HF model directory, an HF cache entry (org/name), a
    /// short name from ferrite's model directory (see `ferrite list`), or, for
    /// `bench`, random:PRESET[:TYPE] (random weights of a published shape, e.g.
    /// random:llama-3.1-8b:q4_k_m).
    pub model: String,
    /// Worker threads (default: one per physical core).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Context in tokens: the KV cache of `run` and `bench`, the longest request
    /// of `serve` (default: the model's context, at most 8192).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// KV-cache precision: f16 or f32 (default: f16 for GGUF, like llama.cpp,
    /// and on GPUs; f32 for safetensors checkpoints and random models on the CPU).
    #[arg(long)]
    pub kv_cache: Option<ferrite_models::KvDtype>,
    #[command(flatten)]
    pub device: device::DeviceArgs,
}

#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(short = 'n', long, visible_alias = "n-predict", default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 = greedy.
    // allow_negative_numbers: `--temperature -1` reaches validation and gets a
    // clear error instead of clap's "unexpected argument '-1'".
    #[arg(long, visible_alias = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    #[command(flatten)]
    pub penalties: PenaltyArgs,
    /// Same seed, same output.
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
}

/// The penalties over a sequence's history (`run`'s sampling, `bench`'s decode test).
#[derive(Args, Clone, Debug)]
pub struct PenaltyArgs {
    /// Over the last 64 tokens; 1.0 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
}

/// A sampling setting's error as the CLI's flags name it (`SamplingParams::validate`
/// speaks the HTTP API's field names).
pub fn flag_error(msg: String) -> ferrite_core::Error {
    let names = [
        ("repetition_penalty", "--repeat-penalty"),
        ("presence_penalty", "--presence-penalty"),
        ("frequency_penalty", "--frequency-penalty"),
        ("temperature", "--temperature"),
        ("top_p", "--top-p"),
        ("min_p", "--min-p"),
    ];
    let msg = names.iter().fold(msg, |m, (field, flag)| m.replace(field, flag));
    ferrite_core::Error::InvalidInput(msg)
}

impl PenaltyArgs {
    /// `params` with these penalties.
    pub fn apply(&self, params: SamplingParams) -> SamplingParams {
        SamplingParams {
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            ..params
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Chat with a model, or complete one prompt with --prompt.
    Run(run::RunArgs),
    /// Perplexity of a text file (llama.cpp method: windows of --ctx tokens, second half scored).
    Perplexity(perplexity::PerplexityArgs),
    /// OpenAI-compatible HTTP server with continuous batching.
    Serve(serve::ServeArgs),
    /// Load generator for an OpenAI-compatible server: throughput and latency percentiles.
    BenchServe(bench_serve::BenchServeArgs),
    /// Sentence embeddings of texts or a file's lines, as JSON lines.
    Embed(embed::EmbedArgs),
    /// Prefill and decode speed, like llama-bench.
    Bench(bench::BenchArgs),
    /// Logits at every position of a token-id sequence, as JSON lines.
    Score(score::ScoreArgs),
    /// Architecture, sizes, tensor types, tokenizer and template of a model.
    Inspect(inspect::InspectArgs),
    /// Models in ferrite's model directory.
    List,
    /// On a GPU machine: every CUDA op against the CPU, the hardware ceilings,
    /// and models teacher-forced on GPU and CPU.
    GpuCheck(gpu_check::GpuCheckArgs),
}

fn main() -> ExitCode {
    alloc::tune();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::main(a),
        Command::Perplexity(a) => perplexity::main(a),
        Command::Serve(a) => serve::main(a),
        Command::BenchServe(a) => bench_serve::main(a),
        Command::Embed(a) => embed::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Score(a) => score::main(a),
        Command::Inspect(a) => inspect::main(a),
        Command::List => inspect::list(),
        Command::GpuCheck(a) => gpu_check::main(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): nothing left to say to anyone.
        Err(ferrite_core::Error::Io { path, source })
            if source.kind() == std::io::ErrorKind::BrokenPipe && path.as_os_str() == STDOUT =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            // One line, whatever the message holds.
            eprintln!("error: {}", e.to_string().replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    /// Clap's own checks of every command's flags (no short flag taken twice
    /// where commands flatten shared options).
    #[test]
    fn flags_are_consistent() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
