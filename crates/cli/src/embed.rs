//! `ferrite embed`: sentence embeddings as JSON lines, one per input, in order.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;

use clap::Args;
use ferrite_core::{Error, Result};
use ferrite_engine::embed::Pooling;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use crate::load::{init_threads, load_embedder, Precision};

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// An embedding model (BERT or ModernBERT HF directory, or a short name).
    pub model: String,
    /// Texts to embed (each one input).
    pub texts: Vec<String>,
    /// Also embed every line of this file ("-" for standard input).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// L2-normalize the vectors (on already when the model's settings say so).
    #[arg(long)]
    pub normalize: bool,
    /// Inputs per forward pass.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Cut inputs longer than the model's limit instead of failing.
    #[arg(long)]
    pub truncate: bool,
    /// Pooling: cls, mean, last or max (default: the model's setting, else mean).
    #[arg(long)]
    pub pooling: Option<Pooling>,
    /// Matmul arithmetic: f32, or bf16 products (twice as fast where the CPU
    /// has AVX-512 BF16; cosine ~0.99997 to f32 on all-MiniLM-L6-v2).
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    pub precision: Precision,
    /// Worker threads (default: one per physical core).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub device: crate::device::DeviceArgs,
}

fn read_lines(path: &PathBuf) -> Result<Vec<String>> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        Box::new(std::io::BufReader::new(f))
    };
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            return Err(Error::InvalidInput(format!("{}: line {} is empty", path.display(), i + 1)));
        }
        out.push(line);
    }
    Ok(out)
}

/// JSON lines for vectors numbered from `first`, formatted on every core.
fn format_lines(vectors: &[Vec<f32>], first: usize) -> Vec<String> {
    vectors
        .par_iter()
        .enumerate()
        .map(|(i, v)| {
            // f32 values print in their shortest round-trip form.
            let v = serde_json::to_string(v).expect("floats serialize");
            format!("{{\"index\":{},\"embedding\":{v}}}\n", first + i)
        })
        .collect()
}

pub fn main(a: EmbedArgs) -> Result<()> {
    if a.batch_size == 0 {
        return Err(Error::InvalidInput("--batch-size must be at least 1".into()));
    }
    let mut texts = a.texts.clone();
    if let Some(f) = &a.file {
        texts.extend(read_lines(f)?);
    }
    if texts.is_empty() {
        return Err(Error::InvalidInput("nothing to embed: give texts or --file".into()));
    }
    init_threads(a.threads)?;
    let e = load_embedder(&a.model, a.pooling, a.precision, &a.device)?;
    // Tokenize everything first: a bad input fails before any output.
    let ids = e.tokenize_all(&texts, a.truncate).map_err(|err| match err {
        Error::InvalidInput(m) if m.contains("more than the model's") => {
            Error::InvalidInput(format!("{m}; --truncate cuts long inputs"))
        }
        other => other,
    })?;
    let bar = if a.file.is_some() { ProgressBar::new(texts.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("embedding [{bar:30}] {pos}/{len} ({per_sec})").unwrap().progress_chars("=> "),
    );
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut write = |lines: Vec<String>| -> Result<()> {
        for line in &lines {
            out.write_all(line.as_bytes()).map_err(|err| Error::io("standard output", err))?;
        }
        Ok(())
    };
    // Batch i's lines are formatted on other threads while batch i + 1 is
    // embedded (on a GPU the device would otherwise wait for the formatting).
    std::thread::scope(|scope| -> Result<()> {
        let mut pending: Option<std::thread::ScopedJoinHandle<'_, Vec<String>>> = None;
        let mut index = 0;
        for chunk in ids.chunks(a.batch_size) {
            let vectors = e.embed_tokens(chunk, a.normalize)?;
            let first = index;
            index += vectors.len();
            let next = scope.spawn(move || format_lines(&vectors, first));
            if let Some(done) = pending.replace(next) {
                write(done.join().expect("formatting never panics"))?;
            }
            bar.inc(chunk.len() as u64);
        }
        if let Some(done) = pending {
            write(done.join().expect("formatting never panics"))?;
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    out.flush().map_err(|err| Error::io("standard output", err))
}
