//! Random prompts: words drawn from a fixed list, different for every request,
//! deterministic for a seed. Every word of the list is one token (with its
//! leading space) for GPT-2-style BPE vocabularies (checked against SmolLM2's:
//! 128 random words tokenize to exactly 128 tokens), so `n` words are about
//! `n` tokens; when the server can tokenize, the word count is adjusted until
//! the server counts the target exactly.

/// Common English words, each a single GPT-2-style BPE token after a space.
#[rustfmt::skip]
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "he",
    "it", "an", "are", "were", "which", "be", "this", "had", "not", "or", "have", "but", "they", "their", "one",
    "has", "its", "new", "first", "been", "after", "who", "also", "two", "her", "more", "other", "she", "all",
    "there", "into", "time", "when", "would", "up", "only", "some", "years", "over", "year", "can", "about", "than",
    "out", "most", "city", "state", "these", "so", "three", "them", "later", "world", "between", "many", "may",
    "such", "during", "under", "where", "while", "part", "people", "family", "school", "both", "then", "could", "him",
    "well", "known", "made", "through", "before", "used", "american", "national", "since", "including", "life",
    "united", "war", "second", "being", "until", "same", "work", "number", "game", "name", "house", "government",
    "early", "four", "area", "team", "home", "each", "season", "did", "film", "several", "century", "series", "held",
    "water", "small", "long", "great", "place", "high", "music", "way", "own", "around", "against", "country",
    "group", "end", "however", "often", "public", "large", "local", "best", "main", "back", "general", "old", "south",
    "north", "east", "west", "word", "right", "good", "little", "just", "day", "man", "thing", "think", "make",
    "take", "come", "see", "know", "get", "give", "find", "tell", "ask", "seem", "feel", "try", "leave", "call",
    "keep", "let", "begin", "show", "hear", "play", "run", "move", "live", "believe", "bring", "happen", "write",
    "provide", "sit", "stand", "lose", "pay", "meet", "include", "continue", "set", "learn", "change", "lead",
    "understand", "watch", "follow", "stop", "create", "speak", "read", "allow", "add", "spend", "grow", "open",
    "walk", "win", "offer", "remember", "love", "consider", "appear", "buy", "wait", "serve", "die", "send", "expect",
    "build", "stay", "fall", "cut", "reach", "kill", "remain", "suggest", "raise", "pass", "sell", "require",
    "report", "decide", "pull", "child", "woman", "men", "children", "women", "point", "hand", "eye", "job",
    "business", "issue", "side", "kind", "head", "service", "friend", "father", "power", "hour", "mother", "member",
    "car", "community", "president", "minute", "idea", "body", "information", "parent", "face", "others", "level",
    "office", "door", "health", "person", "art", "history", "party", "result", "morning", "reason", "research",
    "girl", "guy", "moment", "air", "teacher", "force", "education", "foot", "boy", "age", "policy", "process",
    "market", "sense", "nation", "plan", "college", "interest", "death", "experience", "effect", "class", "control",
    "care", "field", "development", "role", "effort", "rate", "heart", "drug", "leader", "light", "voice", "wife",
    "police", "mind", "price", "decision", "son", "view", "relationship", "town", "road", "arm", "difference",
    "value", "building", "action", "model", "society", "tax", "director", "position", "player", "record", "paper",
    "space", "ground", "form", "event", "official", "matter", "center", "couple", "site", "project", "activity",
    "star", "table", "need", "court", "oil", "situation", "cost", "industry", "figure", "street", "image", "phone",
    "data", "picture", "practice", "piece", "land", "product", "doctor", "wall", "patient", "worker", "news", "test",
    "movie", "support", "technology", "step", "baby", "computer", "type", "attention", "tree", "source",
    "organization", "hair", "window", "evidence", "population", "truth", "song", "economy", "stage", "rock", "letter",
    "ball", "hospital", "fact", "black", "white", "red", "blue", "green", "young", "human", "social", "real", "free",
    "sure", "strong", "happy", "easy", "hard", "late", "short", "clear", "big", "full", "dark", "cold", "hot", "warm",
    "bad", "poor", "rich", "simple", "possible", "important", "political", "available", "likely", "certain", "whole",
    "special", "military", "single", "medical", "current", "wrong", "private", "past", "foreign", "fine", "common",
    "natural", "significant", "similar", "dead", "central", "ready", "left", "physical", "environmental", "financial",
    "democratic", "various", "entire", "close", "legal", "religious", "final", "nice", "huge", "popular",
    "traditional", "cultural", "river", "mountain", "ocean", "island", "forest", "garden", "village", "kitchen",
    "bridge", "station", "church", "castle", "library", "museum", "hotel", "airport", "beach", "desert", "valley",
    "lake", "farm",
];

/// SplitMix64: tiny, good enough, and stable across platforms and versions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The endless word sequence of one request: the prompt of `n` words is its
/// first `n` words, so lengthening or shortening keeps the start.
pub struct Words {
    rng: Rng,
    words: Vec<&'static str>,
}

impl Words {
    /// Request `index` of a run with `seed`.
    pub fn new(seed: u64, index: u64) -> Self {
        let mut rng = Rng(seed ^ index.wrapping_add(1).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        // Decorrelate nearby seeds and indices.
        rng.next();
        Words { rng, words: Vec::new() }
    }

    /// The first `n` words, joined by spaces.
    pub fn text(&mut self, n: usize) -> String {
        while self.words.len() < n {
            let w = WORDS[(self.rng.next() % WORDS.len() as u64) as usize];
            self.words.push(w);
        }
        self.words[..n].join(" ")
    }
}

/// Calibration step: the word count to try next, given that `words` words
/// tokenized to `tokens` and the target is `target` tokens. Never 0.
pub fn next_word_count(words: usize, tokens: usize, target: usize) -> usize {
    (words as i64 + target as i64 - tokens as i64).max(1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_per_seed_and_index() {
        let a = Words::new(0, 0).text(64);
        assert_eq!(a, Words::new(0, 0).text(64));
        assert_eq!(a.split(' ').count(), 64);
        assert_ne!(a, Words::new(0, 1).text(64));
        assert_ne!(a, Words::new(1, 0).text(64));
        // Every request of a run starts differently (no shared prefix for a
        // prefix cache to reuse).
        let firsts: std::collections::HashSet<String> = (0..32).map(|i| Words::new(7, i).text(4)).collect();
        assert_eq!(firsts.len(), 32);
        // Pinned output: prompts must not change between versions, or runs
        // stop being comparable.
        assert_eq!(Words::new(0, 0).text(6), "ball wall that work blue made");
    }

    #[test]
    fn lengthening_keeps_the_prefix() {
        let mut w = Words::new(3, 5);
        let short = w.text(10);
        let long = w.text(20);
        assert!(long.starts_with(&short));
        assert_eq!(w.text(10), short);
        assert_eq!(w.text(0), "");
    }

    #[test]
    fn word_list_is_clean() {
        let set: std::collections::HashSet<_> = WORDS.iter().collect();
        assert_eq!(set.len(), WORDS.len(), "duplicate words");
        assert!(WORDS.iter().all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase())));
    }

    #[test]
    fn calibration_steps() {
        assert_eq!(next_word_count(128, 130, 128), 126);
        assert_eq!(next_word_count(128, 127, 128), 129);
        assert_eq!(next_word_count(2, 10, 1), 1);
    }
}
