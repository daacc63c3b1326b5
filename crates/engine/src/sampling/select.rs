//! Partial selection over a vocabulary-sized logits vector: the k best
//! tokens and the top-p prefix, without sorting the whole vocabulary.

use std::cmp::Ordering;

use super::math::exp_fast;

/// A token still in the running, with its logit (later reused for its weight).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Candidate {
    pub id: u32,
    pub logit: f32,
}

/// Best first: higher logit, then lower id, so ties resolve like argmax.
pub(crate) fn best_first(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

fn better(a: &Candidate, b: &Candidate) -> bool {
    best_first(a, b) == Ordering::Less
}

/// Fills `out` with every entry whose logit is at least `floor`, in id order.
/// Branchless: each entry is written, and the write position advances only
/// when it passes, so unpredictable keep rates cost no mispredictions.
pub(crate) fn at_least_into(logits: &[f32], floor: f32, out: &mut Vec<Candidate>) {
    out.clear();
    out.resize(logits.len(), Candidate { id: 0, logit: 0.0 });
    let mut n = 0;
    for (i, &logit) in logits.iter().enumerate() {
        out[n] = Candidate { id: i as u32, logit };
        n += usize::from(logit >= floor);
    }
    out.truncate(n);
}

/// Above this k a full `select_nth_unstable` beats the heap scan.
const HEAP_MAX_K: usize = 4096;

/// Fills `out` with the `k` best entries of `logits`, best first.
/// `k` is clamped to the vocabulary size.
pub(crate) fn top_k_into(logits: &[f32], k: usize, out: &mut Vec<Candidate>) {
    out.clear();
    let k = k.min(logits.len());
    if k == 0 {
        return;
    }
    if k > HEAP_MAX_K {
        out.extend(logits.iter().enumerate().map(|(i, &logit)| Candidate { id: i as u32, logit }));
        if k < out.len() {
            out.select_nth_unstable_by(k - 1, best_first);
            out.truncate(k);
        }
    } else {
        heap_top_k(logits, k, out);
    }
    out.sort_unstable_by(best_first);
}

/// One pass with a min-heap of the k best seen so far. After warm-up nearly
/// every entry loses to the heap's worst, so blocks are first screened with a
/// plain (vectorizable) compare against its logit.
fn heap_top_k(logits: &[f32], k: usize, heap: &mut Vec<Candidate>) {
    const BLOCK: usize = 16;
    let warm = k.min(logits.len());
    for (i, &logit) in logits[..warm].iter().enumerate() {
        heap.push(Candidate { id: i as u32, logit });
        let last = heap.len() - 1;
        sift_up(heap, last);
    }
    let rest = &logits[warm..];
    let blocks = rest.chunks_exact(BLOCK);
    let tail_start = warm + rest.len() - blocks.remainder().len();
    for (b, block) in blocks.enumerate() {
        let floor = heap[0].logit;
        // `>=`, not `>`: signed zeros compare equal yet `best_first` orders them.
        if block.iter().fold(false, |any, &x| any | (x >= floor)) {
            for (j, &logit) in block.iter().enumerate() {
                offer(heap, warm + b * BLOCK + j, logit);
            }
        }
    }
    for (j, &logit) in logits[tail_start..].iter().enumerate() {
        offer(heap, tail_start + j, logit);
    }
}

/// Replaces the heap's worst with the candidate if the candidate is better.
fn offer(heap: &mut [Candidate], i: usize, logit: f32) {
    let c = Candidate { id: i as u32, logit };
    if better(&c, &heap[0]) {
        heap[0] = c;
        sift_down(heap, 0);
    }
}

/// Min-heap by quality: the root is the worst kept candidate.
fn sift_up(heap: &mut [Candidate], mut i: usize) {
    while i > 0 {
        let parent = (i - 1) / 2;
        if better(&heap[parent], &heap[i]) {
            heap.swap(parent, i);
            i = parent;
        } else {
            break;
        }
    }
}

fn sift_down(heap: &mut [Candidate], mut i: usize) {
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut worst = i;
        if l < heap.len() && better(&heap[worst], &heap[l]) {
            worst = l;
        }
        if r < heap.len() && better(&heap[worst], &heap[r]) {
            worst = r;
        }
        if worst == i {
            return;
        }
        heap.swap(i, worst);
        i = worst;
    }
}

/// Below this many candidates top-p just sorts them.
const SORT_MAX: usize = 256;
/// Histogram buckets by distance below the max logit, `1 / BUCKETS_PER_NAT`
/// nats wide; the last one also takes everything further down.
const BUCKETS: usize = 64;
const BUCKETS_PER_NAT: f32 = 4.0;

/// Number of leading candidates top-p keeps: the smallest best-first set
/// whose mass `sum exp(logit - max)` reaches `top_p * z`. On return those are
/// `cand[..n]`, in a deterministic order that is not necessarily sorted.
///
/// A flat distribution's nucleus can hold tens of thousands of tokens, so
/// instead of sorting, the mass is histogrammed by logit; only the bucket
/// where the cut falls is sorted.
pub(crate) fn top_p_len(cand: &mut [Candidate], max: f32, z: f64, top_p: f32) -> usize {
    let target = f64::from(top_p) * z;
    if cand.len() <= SORT_MAX {
        cand.sort_unstable_by(best_first);
        return prefix_reaching(cand, max, 0.0, target).unwrap_or(cand.len());
    }
    let bucket = |c: &Candidate| (((max - c.logit) * BUCKETS_PER_NAT) as usize).min(BUCKETS - 1);
    let mut mass = [0.0f64; BUCKETS];
    for c in cand.iter() {
        mass[bucket(c)] += f64::from(exp_fast(c.logit - max));
    }
    let mut before = 0.0;
    let mut cut = BUCKETS - 1;
    for (b, &m) in mass.iter().enumerate() {
        if before + m >= target {
            cut = b;
            break;
        }
        before += m;
    }
    // Three-way partition: buckets above the cut, the cut bucket, the rest.
    let (mut lo, mut mid, mut hi) = (0, 0, cand.len());
    while mid < hi {
        match bucket(&cand[mid]).cmp(&cut) {
            Ordering::Less => {
                cand.swap(lo, mid);
                lo += 1;
                mid += 1;
            }
            Ordering::Equal => mid += 1,
            Ordering::Greater => {
                hi -= 1;
                cand.swap(mid, hi);
            }
        }
    }
    let cut_bucket = &mut cand[lo..hi];
    cut_bucket.sort_unstable_by(best_first);
    // Rounding can leave the walk a hair short: then the whole bucket stays.
    lo + prefix_reaching(cut_bucket, max, before, target).unwrap_or(cut_bucket.len())
}

/// Length of the shortest prefix of sorted `cand` whose mass, added to
/// `start`, reaches `target`.
fn prefix_reaching(cand: &[Candidate], max: f32, start: f64, target: f64) -> Option<usize> {
    let mut cum = start;
    cand.iter()
        .position(|c| {
            cum += f64::from(exp_fast(c.logit - max));
            cum >= target
        })
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::rng::Rng;

    fn random_logits(n: usize, seed: u64) -> Vec<f32> {
        let mut r = Rng::seeded(seed);
        // Coarse values so ties occur and the id tie-break is exercised.
        (0..n).map(|_| ((r.next_f64() * 200.0).floor() / 10.0) as f32 - 10.0).collect()
    }

    fn reference_sorted(logits: &[f32]) -> Vec<Candidate> {
        let mut all: Vec<Candidate> =
            logits.iter().enumerate().map(|(i, &logit)| Candidate { id: i as u32, logit }).collect();
        all.sort_by(best_first);
        all
    }

    #[test]
    fn top_k_matches_full_sort_for_heap_and_select_paths() {
        let logits = random_logits(20_000, 1);
        let sorted = reference_sorted(&logits);
        let mut out = Vec::new();
        for k in [1, 2, 40, 1000, 5000, 19_999, 20_000, 30_000] {
            top_k_into(&logits, k, &mut out);
            assert_eq!(out[..], sorted[..k.min(20_000)], "k = {k}");
        }
        top_k_into(&logits, 0, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn at_least_into_keeps_passing_entries_in_order() {
        let logits = [1.0, -2.0, 3.0, f32::NEG_INFINITY, 0.5, 2.0];
        let mut out = vec![Candidate { id: 9, logit: 9.0 }];
        at_least_into(&logits, 1.0, &mut out);
        let ids: Vec<u32> = out.iter().map(|c| c.id).collect();
        assert_eq!(ids, [0, 2, 5]);
        at_least_into(&logits, f32::NEG_INFINITY, &mut out);
        assert_eq!(out.len(), 6);
        at_least_into(&logits, 10.0, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn top_p_len_finds_smallest_prefix() {
        for (n, spread) in [(3000, 20.0), (200, 20.0), (50_000, 2.0), (50_000, 40.0)] {
            let logits: Vec<f32> = random_logits(n, 2).iter().map(|x| x * spread / 20.0).collect();
            let sorted = reference_sorted(&logits);
            let max = sorted[0].logit;
            let w: Vec<f64> = sorted.iter().map(|c| f64::from(exp_fast(c.logit - max))).collect();
            let z: f64 = w.iter().sum();
            // The sampler never calls it with p >= 1 (top-p off).
            for p in [0.0, 0.1, 0.5, 0.9, 0.999] {
                let mut cand: Vec<Candidate> =
                    logits.iter().enumerate().map(|(i, &logit)| Candidate { id: i as u32, logit }).collect();
                let kept = top_p_len(&mut cand, max, z, p);
                let mut got: Vec<u32> = cand[..kept].iter().map(|c| c.id).collect();
                got.sort_unstable();
                // Reference: walk the fully sorted list (ties: lower id first).
                let mut cum = 0.0;
                let want_len = w
                    .iter()
                    .position(|x| {
                        cum += x;
                        cum >= f64::from(p) * z
                    })
                    .map_or(n, |i| i + 1);
                let mut want: Vec<u32> = sorted[..want_len].iter().map(|c| c.id).collect();
                want.sort_unstable();
                assert_eq!(got, want, "n {n}, spread {spread}, p {p}");
            }
        }
    }
}
