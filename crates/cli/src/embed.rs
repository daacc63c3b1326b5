//! `ferrite embed`: sentence embeddings as JSON lines, one per input, in order.

use std::collections::VecDeque;
use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use clap::Args;
use ferrite_core::{Error, Result};
use ferrite_engine::embed::{Embedder, Pooling};
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

/// What the tokenizing thread sends: batches in input order, then whether
/// every input tokenized (an error names the first bad one).
enum Tokenized {
    Batch(Vec<Vec<u32>>),
    Done(Result<()>),
}

/// Tokenizes `texts` on all cores, a group of batches at a time, sending each
/// batch as soon as its group is done, so forward passes start early.
fn tokenize_ahead(e: &Embedder, texts: &[String], batch: usize, truncate: bool, tx: mpsc::Sender<Tokenized>) {
    let group = batch * 1024usize.div_ceil(batch);
    for (g, chunk) in texts.chunks(group).enumerate() {
        let ids = match e.tokenize_numbered(chunk, g * group, truncate) {
            Ok(ids) => ids,
            Err(Error::InvalidInput(m)) if m.contains("more than the model's") => {
                let _ = tx.send(Tokenized::Done(Err(Error::InvalidInput(format!("{m}; --truncate cuts long inputs")))));
                return;
            }
            Err(err) => {
                let _ = tx.send(Tokenized::Done(Err(err)));
                return;
            }
        };
        let mut ids = ids.into_iter().peekable();
        while ids.peek().is_some() {
            if tx.send(Tokenized::Batch(ids.by_ref().take(batch).collect())).is_err() {
                return; // the receiver stopped (an error there)
            }
        }
    }
    let _ = tx.send(Tokenized::Done(Ok(())));
}

/// Formatted output bytes held at most while later inputs are still being
/// tokenized; beyond it, forward passes wait for the last input's verdict.
const HOLD_BYTES: usize = 256 << 20;

/// Standard output that holds its lines until every input has tokenized: a
/// bad input anywhere fails the run before any output.
struct Output<W: Write> {
    out: W,
    held: Vec<String>,
    held_bytes: usize,
    open: bool,
}

impl<W: Write> Output<W> {
    fn push(&mut self, lines: Vec<String>) -> Result<()> {
        if !self.open {
            self.held_bytes += lines.iter().map(|l| l.len()).sum::<usize>();
            self.held.extend(lines);
            return Ok(());
        }
        for line in &lines {
            self.out.write_all(line.as_bytes()).map_err(|err| Error::io("standard output", err))?;
        }
        Ok(())
    }

    /// Every input tokenized: writes what was held, and all later lines at once.
    fn open(&mut self) -> Result<()> {
        self.open = true;
        let held = std::mem::take(&mut self.held);
        self.held_bytes = 0;
        self.push(held)
    }

    fn full(&self) -> bool {
        !self.open && self.held_bytes > HOLD_BYTES
    }
}

/// Wall time of each phase, for FERRITE_PROFILE.
#[derive(Default)]
struct Phases {
    load_ms: f64,
    forward_ms: f64,
    total_ms: f64,
}

pub fn main(a: EmbedArgs) -> Result<()> {
    if a.batch_size == 0 {
        return Err(Error::InvalidInput("--batch-size must be at least 1".into()));
    }
    let started = Instant::now();
    let mut texts = a.texts.clone();
    if let Some(f) = &a.file {
        texts.extend(read_lines(f)?);
    }
    if texts.is_empty() {
        return Err(Error::InvalidInput("nothing to embed: give texts or --file".into()));
    }
    init_threads(a.threads)?;
    let e = load_embedder(&a.model, a.pooling, a.precision, &a.device)?;
    let mut phases = Phases { load_ms: ms(started), ..Phases::default() };
    let bar = if a.file.is_some() { ProgressBar::new(texts.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("embedding [{bar:30}] {pos}/{len} ({per_sec})").unwrap().progress_chars("=> "),
    );
    let mut out = Output { out: BufWriter::new(std::io::stdout().lock()), held: Vec::new(), held_bytes: 0, open: false };
    let (tx, rx) = mpsc::channel();
    let run = Instant::now();
    let mut embedded = 0;
    // Tokenizing runs ahead of the forward passes; batch i's lines are
    // formatted on other threads while batch i + 1 is embedded (on a GPU the
    // device would otherwise wait for the host).
    std::thread::scope(|scope| -> Result<()> {
        let (e, texts) = (&e, &texts);
        scope.spawn(move || tokenize_ahead(e, texts, a.batch_size, a.truncate, tx));
        let mut backlog: VecDeque<Vec<Vec<u32>>> = VecDeque::new();
        let mut pending: Option<std::thread::ScopedJoinHandle<'_, Vec<String>>> = None;
        loop {
            let ids = match backlog.pop_front() {
                Some(ids) => ids,
                None => match rx.recv() {
                    Ok(Tokenized::Batch(ids)) => ids,
                    Ok(Tokenized::Done(verdict)) => {
                        verdict?;
                        out.open()?;
                        continue;
                    }
                    Err(_) => break,
                },
            };
            if out.full() {
                // Too much held: take every remaining batch and the verdict first.
                backlog.push_back(ids);
                for msg in rx.iter() {
                    match msg {
                        Tokenized::Batch(ids) => backlog.push_back(ids),
                        Tokenized::Done(verdict) => {
                            verdict?;
                            out.open()?;
                        }
                    }
                }
                continue;
            }
            let t = Instant::now();
            let vectors = e.embed_tokens(&ids, a.normalize)?;
            phases.forward_ms += ms(t);
            let first = embedded;
            embedded += vectors.len();
            let next = scope.spawn(move || format_lines(&vectors, first));
            if let Some(done) = pending.replace(next) {
                out.push(done.join().expect("formatting never panics"))?;
            }
            bar.inc(ids.len() as u64);
        }
        if let Some(done) = pending {
            out.push(done.join().expect("formatting never panics"))?;
        }
        Ok(())
    })?;
    if !out.open || embedded != texts.len() {
        return Err(Error::InvalidInput("tokenizing stopped before every input was done".into()));
    }
    bar.finish_and_clear();
    out.out.flush().map_err(|err| Error::io("standard output", err))?;
    phases.total_ms = ms(run);
    if ferrite_core::env::profiling() {
        eprintln!(
            "embed: {} inputs; start and load {:.1} ms, then {:.1} ms to embed and write all (forward passes {:.1} ms of it)",
            texts.len(),
            phases.load_ms,
            phases.total_ms,
            phases.forward_ms
        );
        if let Some(p) = ferrite_backend::cuda::profile::take().filter(|p| !p.ops.is_empty()) {
            eprintln!("{}", p.table());
        }
    }
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}
