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
    /// Matmul arithmetic (embedding models): auto (bf16 where the hardware
    /// multiplies bf16 natively: NVIDIA GPUs, CPUs with AVX-512 BF16; else
    /// f32), f32 (exact), or bf16. bf16 is about 1.5x as fast on such CPUs,
    /// cosine 0.99996 or more to f32 on all-MiniLM-L6-v2.
    #[arg(long, value_enum, default_value_t = Precision::Auto)]
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
        let line = line.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => {
                Error::InvalidInput(format!("{}: line {} is not valid UTF-8", path.display(), i + 1))
            }
            _ => Error::io(path, e),
        })?;
        if line.trim().is_empty() {
            return Err(Error::InvalidInput(format!(
                "{}: line {} is empty (each line is one input; remove blank lines first)",
                path.display(),
                i + 1
            )));
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

/// Vector values held at most (about 10 bytes each as text) while later
/// inputs are still being tokenized; beyond it, forward passes wait for the
/// last input's verdict.
const HOLD_VALUES: usize = 32 << 20;

/// What the writing thread receives, in order.
enum ToWriter {
    Vectors(Vec<Vec<f32>>),
    /// Every input tokenized: what was held, and all later lines, go out.
    Open,
}

/// How writing ended.
#[derive(PartialEq)]
enum Written {
    All,
    /// The reader closed standard output (`| head`): nothing more is wanted.
    Closed,
}

/// Formats (on all cores) and writes the vectors it is sent, holding the
/// lines until `Open`: a bad input anywhere fails the run before any output.
/// Writing on its own thread keeps the forward passes (and the GPU) going
/// while standard output drains.
fn write_lines(rx: mpsc::Receiver<ToWriter>) -> Result<Written> {
    // Large writes: the vectors of a big file are tens of megabytes of text.
    let mut out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let (mut held, mut open, mut index) = (Vec::new(), false, 0);
    let write = |out: &mut BufWriter<_>, lines: &[String]| lines.iter().try_for_each(|l| out.write_all(l.as_bytes()));
    let result = || -> std::io::Result<()> {
        for msg in rx {
            match msg {
                ToWriter::Vectors(v) => {
                    let lines = format_lines(&v, index);
                    index += v.len();
                    if open {
                        write(&mut out, &lines)?;
                    } else {
                        held.extend(lines);
                    }
                }
                ToWriter::Open => {
                    open = true;
                    write(&mut out, &std::mem::take(&mut held))?;
                }
            }
        }
        out.flush()
    };
    match result() {
        Ok(()) => Ok(Written::All),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Written::Closed),
        Err(e) => Err(Error::io(crate::STDOUT, e)),
    }
}

/// Wall time of each phase, for FERRITE_PROFILE.
struct Phases {
    load_ms: f64,
    forward_ms: f64,
    total_ms: f64,
    /// Since the run began: the first batch tokenized, the last pass done.
    first_batch_ms: f64,
    last_pass_ms: f64,
    /// When the run (after loading) began.
    run: Instant,
}

impl Phases {
    /// Phases of a run that begins now, after `load_ms` of loading.
    fn new(load_ms: f64) -> Phases {
        Phases { load_ms, forward_ms: 0.0, total_ms: 0.0, first_batch_ms: 0.0, last_pass_ms: 0.0, run: Instant::now() }
    }

    fn since_run(&self, t: Instant) -> f64 {
        t.duration_since(self.run).as_secs_f64() * 1e3
    }
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
        return Err(Error::InvalidInput(match &a.file {
            Some(f) => format!("{}: no lines to embed", f.display()),
            None => "nothing to embed: give texts or --file".into(),
        }));
    }
    init_threads(a.threads)?;
    let e = load_embedder(&a.model, a.pooling, a.precision, &a.device)?;
    let load_ms = ms(started);
    let bar = if a.file.is_some() { ProgressBar::new(texts.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("embedding [{bar:30}] {pos}/{len} ({per_sec})").unwrap().progress_chars("=> "),
    );
    let mut phases = Phases::new(load_ms);
    // Three threads in a pipeline: tokenizing runs ahead of the forward
    // passes (here), and formatting and writing run behind them.
    std::thread::scope(|scope| -> Result<()> {
        let (e, texts) = (&e, &texts);
        let (tok_tx, tok_rx) = mpsc::channel();
        scope.spawn(move || tokenize_ahead(e, texts, a.batch_size, a.truncate, tok_tx));
        let (out_tx, out_rx) = mpsc::channel();
        let writer = scope.spawn(move || write_lines(out_rx));
        let embedded = embed_batches(e, a.normalize, HOLD_VALUES, &tok_rx, &out_tx, &bar, &mut phases);
        drop(out_tx);
        // A failed write explains a failed send: it comes first. A reader that
        // closed the pipe ends the run quietly.
        if writer.join().expect("the writer never panics")? == Written::Closed {
            return Ok(());
        }
        if embedded? != texts.len() {
            return Err(stopped());
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    phases.total_ms = ms(phases.run);
    if ferrite_core::env::profiling_phases() {
        eprintln!(
            "embed: {} inputs; start and load {:.1} ms, then {:.1} ms to embed and write all (forward passes {:.1} ms of it; the first began at {:.1} ms, the last ended at {:.1} ms)",
            texts.len(),
            phases.load_ms,
            phases.total_ms,
            phases.forward_ms,
            phases.first_batch_ms,
            phases.last_pass_ms
        );
        if let Some(p) = ferrite_backend::cuda::profile::take().filter(|p| !p.ops.is_empty()) {
            eprintln!("{}", p.table());
        }
    }
    Ok(())
}

/// The forward passes: tokenized batches in, vectors out to the writer,
/// which is told to open once every input has tokenized; at most `hold`
/// values are embedded before that. Returns how many inputs were embedded.
fn embed_batches(
    e: &Embedder,
    normalize: bool,
    hold: usize,
    tokenized: &mpsc::Receiver<Tokenized>,
    out: &mpsc::Sender<ToWriter>,
    bar: &ProgressBar,
    phases: &mut Phases,
) -> Result<usize> {
    let closed = || Error::io(crate::STDOUT, std::io::Error::from(std::io::ErrorKind::BrokenPipe));
    let mut backlog: VecDeque<Vec<Vec<u32>>> = VecDeque::new();
    let (mut embedded, mut open) = (0, false);
    let verdict = |v: Result<()>, open: &mut bool| -> Result<()> {
        v?;
        *open = true;
        out.send(ToWriter::Open).map_err(|_| closed())
    };
    loop {
        let ids = match backlog.pop_front() {
            Some(ids) => ids,
            None => match tokenized.recv() {
                Ok(Tokenized::Batch(ids)) => ids,
                Ok(Tokenized::Done(v)) => {
                    verdict(v, &mut open)?;
                    continue;
                }
                // No verdict means the tokenizing thread died.
                Err(_) if open => return Ok(embedded),
                Err(_) => return Err(stopped()),
            },
        };
        if !open && embedded * e.dim() > hold {
            // Too much held: take every remaining batch and the verdict first.
            backlog.push_back(ids);
            for msg in tokenized.iter() {
                match msg {
                    Tokenized::Batch(ids) => backlog.push_back(ids),
                    Tokenized::Done(v) => verdict(v, &mut open)?,
                }
            }
            if !open {
                return Err(stopped());
            }
            continue;
        }
        let t = Instant::now();
        if embedded == 0 {
            phases.first_batch_ms = phases.since_run(t);
        }
        let vectors = e.embed_tokens(&ids, normalize)?;
        phases.forward_ms += ms(t);
        phases.last_pass_ms = phases.since_run(Instant::now());
        embedded += vectors.len();
        out.send(ToWriter::Vectors(vectors)).map_err(|_| closed())?;
        bar.inc(ids.len() as u64);
    }
}

/// The tokenizing thread ended without its verdict on every input.
fn stopped() -> Error {
    Error::InvalidInput("tokenizing stopped before every input was done".into())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Embedder {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/embed/bert-tiny-cls");
        load_embedder(dir, None, Precision::F32, &crate::device::DeviceArgs::cpu()).unwrap()
    }

    /// Runs `embed_batches` over `msgs` (then the channel closes) with a
    /// hold of `hold` values; returns its result and what the writer got.
    fn run(e: &Embedder, hold: usize, msgs: Vec<Tokenized>) -> (Result<usize>, Vec<&'static str>) {
        let (tok_tx, tok_rx) = mpsc::channel();
        msgs.into_iter().for_each(|m| tok_tx.send(m).unwrap());
        drop(tok_tx);
        let (out_tx, out_rx) = mpsc::channel();
        let r = embed_batches(e, false, hold, &tok_rx, &out_tx, &ProgressBar::hidden(), &mut Phases::new(0.0));
        drop(out_tx);
        let got = out_rx
            .iter()
            .map(|m| match m {
                ToWriter::Vectors(_) => "vectors",
                ToWriter::Open => "open",
            })
            .collect();
        (r, got)
    }

    fn batch() -> Tokenized {
        Tokenized::Batch(vec![vec![1, 200, 2], vec![1, 201, 202, 2]])
    }

    #[test]
    fn batches_run_ahead_of_the_verdict_until_the_hold_is_full() {
        let e = tiny();
        // Room for everything: all batches run, then the writer opens.
        let (r, got) = run(&e, usize::MAX, vec![batch(), batch(), Tokenized::Done(Ok(()))]);
        assert_eq!(r.unwrap(), 4);
        assert_eq!(got, ["vectors", "vectors", "open"]);
        // No room: after the first batch the verdict comes first.
        let (r, got) = run(&e, 0, vec![batch(), batch(), batch(), Tokenized::Done(Ok(()))]);
        assert_eq!(r.unwrap(), 6);
        assert_eq!(got, ["vectors", "open", "vectors", "vectors"]);
    }

    #[test]
    fn a_bad_input_or_a_missing_verdict_is_an_error_and_never_opens_the_output() {
        let e = tiny();
        for hold in [0, usize::MAX] {
            let bad = Tokenized::Done(Err(Error::InvalidInput("input 5: empty text".into())));
            let (r, got) = run(&e, hold, vec![batch(), batch(), bad]);
            assert!(r.unwrap_err().to_string().contains("input 5"));
            assert!(!got.contains(&"open"), "{got:?}");
            // The tokenizing thread gone without a verdict: an error, not a hang.
            let (r, got) = run(&e, hold, vec![batch(), batch()]);
            assert!(r.unwrap_err().to_string().contains("tokenizing stopped"));
            assert!(!got.contains(&"open"), "{got:?}");
        }
    }
}
