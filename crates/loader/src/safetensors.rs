//! Safetensors reader: Hugging Face checkpoints mapped zero-copy.
//!
//! A file is an 8-byte little-endian header length, a JSON header mapping tensor
//! names to `{dtype, shape, data_offsets}` (offsets relative to the data section
//! after the header), then the data. Every header field is checked against the
//! file before it is used, so a corrupt or truncated file is an `Err`.
//! Only float tensors are kept; integer tensors (e.g. BERT's `position_ids`) and
//! dtypes we do not know are skipped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use ferrite_core::{DType, Error, Result};
use memmap2::Mmap;
use serde_json::Value as Json;

/// Headers beyond this are refused as corrupt (the reference reader's limit).
const MAX_HEADER_BYTES: u64 = 100 << 20;
const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";

/// One float tensor: `start..end` are byte offsets into `mmaps()[file]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub file: usize,
    pub start: usize,
    pub end: usize,
}

impl StTensor {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The float tensors of one checkpoint, possibly sharded over several files.
pub struct SafeTensors {
    maps: Vec<Arc<Mmap>>,
    /// In file order, then storage order within each file.
    tensors: Vec<StTensor>,
    by_name: HashMap<String, usize>,
}

/// What one file's header holds: kept tensors, and names skipped for their dtype.
struct ParsedFile {
    tensors: Vec<StTensor>,
    skipped: HashSet<String>,
}

impl SafeTensors {
    /// A model directory: shards named by `model.safetensors.index.json`, else
    /// `model.safetensors`, else every `*.safetensors` file in it.
    pub fn open_dir(dir: &Path) -> Result<SafeTensors> {
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_index(dir, &index);
        }
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Self::open_file(&single);
        }
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        let mut files = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| Error::io(dir, e))?.path();
            if path.is_file() && path.extension().is_some_and(|e| e == "safetensors") {
                files.push(path);
            }
        }
        if files.is_empty() {
            return Err(Error::format(format!(
                "{}: no {INDEX_FILE}, {SINGLE_FILE} or other .safetensors file",
                dir.display()
            )));
        }
        files.sort();
        let parsed = files.iter().map(|p| (p.clone(), None)).collect();
        Self::open_files(parsed)
    }

    /// A single `.safetensors` file.
    pub fn open_file(path: &Path) -> Result<SafeTensors> {
        Self::open_files(vec![(path.to_path_buf(), None)])
    }

    pub fn tensor(&self, name: &str) -> Option<&StTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes; empty for a tensor that does not belong to this checkpoint.
    pub fn data(&self, t: &StTensor) -> &[u8] {
        self.maps.get(t.file).and_then(|m| m.get(t.start..t.end)).unwrap_or(&[])
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// The maps behind `data`, so weights can borrow them past this reader's life.
    pub fn mmaps(&self) -> Vec<Arc<Mmap>> {
        self.maps.clone()
    }

    fn open_index(dir: &Path, index: &Path) -> Result<SafeTensors> {
        let bad = |msg: String| Error::format(format!("{}: {msg}", index.display()));
        let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
        let json: Json = serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let Some(map) = json.get("weight_map").and_then(Json::as_object) else {
            return Err(bad("no \"weight_map\" object".into()));
        };
        // Shard file -> the tensors the index places in it; sorted shard order
        // keeps `StTensor::file` stable.
        let mut shards: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (name, file) in map {
            let Some(file) = file.as_str() else {
                return Err(bad(format!("weight_map entry for '{name}' is not a file name")));
            };
            // Shards must sit in the model directory itself.
            let mut parts = Path::new(file).components();
            if !matches!((parts.next(), parts.next()), (Some(Component::Normal(_)), None)) {
                return Err(bad(format!("shard name '{file}' is not a plain file name")));
            }
            shards.entry(file).or_default().push(name.clone());
        }
        if shards.is_empty() {
            return Err(bad("weight_map is empty".into()));
        }
        let files = shards.into_iter().map(|(file, names)| (dir.join(file), Some(names))).collect();
        Self::open_files(files)
    }

    /// Opens each file; where names are given (from an index), each must be in that file.
    fn open_files(files: Vec<(PathBuf, Option<Vec<String>>)>) -> Result<SafeTensors> {
        let mut maps = Vec::with_capacity(files.len());
        let mut tensors: Vec<StTensor> = Vec::new();
        let mut by_name = HashMap::new();
        for (file_idx, (path, must_hold)) in files.into_iter().enumerate() {
            let map = map_file(&path)?;
            let parsed = parse(&path, &map, file_idx)?;
            for name in must_hold.iter().flatten() {
                let found = parsed.skipped.contains(name) || parsed.tensors.iter().any(|t| &t.name == name);
                if !found {
                    return Err(Error::format(format!(
                        "{}: the index places tensor '{name}' here but the file has no such tensor",
                        path.display()
                    )));
                }
            }
            for t in parsed.tensors {
                if by_name.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(Error::format(format!(
                        "{}: tensor '{}' is also in an earlier file",
                        path.display(),
                        t.name
                    )));
                }
                tensors.push(t);
            }
            maps.push(map);
        }
        Ok(SafeTensors { maps, tensors, by_name })
    }
}

fn map_file(path: &Path) -> Result<Arc<Mmap>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len < 8 {
        return Err(Error::format(format!("{}: {len} bytes is too short for a safetensors file", path.display())));
    }
    // SAFETY: the file is opened read-only and we never write through the map;
    // a model file changing underneath a running process is not supported.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Arc::new(map))
}

fn dtype_of(name: &str) -> Option<DType> {
    match name {
        "F32" => Some(DType::F32),
        "F16" => Some(DType::F16),
        "BF16" => Some(DType::BF16),
        _ => None,
    }
}

/// Validates the header of one mapped file against its length.
fn parse(path: &Path, bytes: &[u8], file: usize) -> Result<ParsedFile> {
    let bad = |msg: String| Error::format(format!("{}: {msg}", path.display()));
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| bad("too short for a safetensors header".into()))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(bad(format!("header length {header_len} is implausible; not a safetensors file?")));
    }
    let data_start = 8 + header_len as usize;
    let Some(header) = bytes.get(8..data_start) else {
        return Err(bad(format!("header length {header_len} runs past the end of the file ({} bytes)", bytes.len())));
    };
    let data_len = bytes.len() - data_start;
    let json: Json = serde_json::from_slice(header).map_err(|e| bad(format!("header is not valid JSON: {e}")))?;
    let Json::Object(entries) = json else {
        return Err(bad("header is not a JSON object".into()));
    };

    let mut parsed = ParsedFile { tensors: Vec::with_capacity(entries.len()), skipped: HashSet::new() };
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        let info = entry_info(&entry).map_err(|msg| bad(format!("tensor '{name}': {msg}")))?;
        if info.start > info.end || info.end > data_len as u64 {
            return Err(bad(format!(
                "tensor '{name}': data offsets [{}, {}] outside the {data_len}-byte data section",
                info.start, info.end
            )));
        }
        let Some(dtype) = dtype_of(&info.dtype) else {
            parsed.skipped.insert(name);
            continue;
        };
        let n = info.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        let want = n.and_then(|n| dtype.bytes_for(n));
        if want != Some(info.end - info.start) {
            return Err(bad(format!(
                "tensor '{name}': {} {:?} needs {} bytes but data offsets span {}",
                dtype,
                info.shape,
                want.map_or("too many".to_string(), |w| w.to_string()),
                info.end - info.start
            )));
        }
        parsed.tensors.push(StTensor {
            name,
            dtype,
            shape: info.shape,
            file,
            // Both fit: they are within the mapped file.
            start: data_start + info.start as usize,
            end: data_start + info.end as usize,
        });
    }
    parsed.tensors.sort_by_key(|t| t.start);
    Ok(parsed)
}

struct EntryInfo {
    dtype: String,
    shape: Vec<usize>,
    start: u64,
    end: u64,
}

fn entry_info(entry: &Json) -> std::result::Result<EntryInfo, String> {
    let dtype = entry.get("dtype").and_then(Json::as_str).ok_or("missing string \"dtype\"")?;
    let shape = entry
        .get("shape")
        .and_then(Json::as_array)
        .ok_or("missing array \"shape\"")?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or("\"shape\" must hold non-negative integers")?;
    let offsets = entry.get("data_offsets").and_then(Json::as_array).ok_or("missing array \"data_offsets\"")?;
    let [start, end] = &offsets[..] else {
        return Err("\"data_offsets\" must hold two integers".into());
    };
    let (Some(start), Some(end)) = (start.as_u64(), end.as_u64()) else {
        return Err("\"data_offsets\" must hold two non-negative integers".into());
    };
    Ok(EntryInfo { dtype: dtype.to_string(), shape, start, end })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TempDir;

    /// A safetensors file from (name, dtype, shape, bytes), laid out in order.
    fn build(tensors: &[(&str, &str, &[usize], &[u8])]) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in tensors {
            let start = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
            );
        }
        with_header(&serde_json::to_string(&header).unwrap(), &data)
    }

    fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn sample() -> Vec<u8> {
        build(&[
            ("w", "F32", &[2, 2], &f32_bytes(&[1.0, 2.0, 3.0, 4.0])),
            ("h", "F16", &[3], &[0, 0x3c, 0, 0x40, 0, 0x42]),
            ("position_ids", "I64", &[1, 2], &[0; 16]),
            ("b", "BF16", &[1], &[0x80, 0x3f]),
            ("odd", "F8_E4M3", &[2], &[1, 2]),
            ("s", "F32", &[], &f32_bytes(&[7.5])),
        ])
    }

    #[test]
    fn reads_float_tensors_and_skips_others() {
        let dir = TempDir::new("ok");
        let path = dir.file("x.safetensors", &sample());
        let st = SafeTensors::open_file(&path).unwrap();
        let names: Vec<&str> = st.names().collect();
        assert_eq!(names, ["w", "h", "b", "s"]);
        let w = st.tensor("w").unwrap();
        assert_eq!((w.dtype, w.shape.clone(), w.file, w.n_elements()), (DType::F32, vec![2, 2], 0, 4));
        assert_eq!(st.data(w), &f32_bytes(&[1.0, 2.0, 3.0, 4.0])[..]);
        assert_eq!(st.data(st.tensor("h").unwrap()), &[0, 0x3c, 0, 0x40, 0, 0x42]);
        assert_eq!(st.tensor("b").unwrap().dtype, DType::BF16);
        assert_eq!(st.data(st.tensor("s").unwrap()), &f32_bytes(&[7.5])[..]);
        assert!(st.tensor("position_ids").is_none() && st.tensor("odd").is_none());
        assert!(st.tensor("__metadata__").is_none());
        assert_eq!(st.mmaps().len(), 1);
        // A tensor from elsewhere yields no bytes rather than a panic.
        let stray = StTensor { file: 9, ..w.clone() };
        assert!(st.data(&stray).is_empty());
    }

    fn open_err(bytes: &[u8]) -> String {
        let dir = TempDir::new("bad");
        let path = dir.file("bad.safetensors", bytes);
        match SafeTensors::open_file(&path) {
            Ok(_) => panic!("corrupt file accepted"),
            Err(e) => {
                assert!(matches!(e, Error::Format(_)), "{e:?}");
                e.to_string()
            }
        }
    }

    #[test]
    fn corrupt_files_are_clear_errors() {
        assert!(open_err(&[1, 2, 3]).contains("too short"));
        assert!(open_err(&u64::MAX.to_le_bytes()).contains("implausible"));
        assert!(open_err(&with_header("{}", &[])[..6]).contains("too short"));
        let mut past = 1000u64.to_le_bytes().to_vec();
        past.extend_from_slice(b"{}");
        assert!(open_err(&past).contains("past the end"));
        assert!(open_err(&with_header("{\"a\": ", &[])).contains("not valid JSON"));
        assert!(open_err(&with_header("[1, 2]", &[])).contains("not a JSON object"));

        let entry = |e: &str| with_header(&format!("{{\"t\": {e}}}"), &[0; 8]);
        let cases = [
            (r#"{"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}"#, "outside"),
            (r#"{"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}"#, "outside"),
            (r#"{"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}"#, "needs 12 bytes"),
            (r#"{"dtype": "F16", "shape": [1, 99999999999, 99999999999], "data_offsets": [0, 8]}"#, "needs"),
            (r#"{"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}"#, "non-negative"),
            (r#"{"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}"#, "non-negative"),
            (r#"{"shape": [2], "data_offsets": [0, 8]}"#, "dtype"),
            (r#"{"dtype": "F32", "data_offsets": [0, 8]}"#, "shape"),
            (r#"{"dtype": "F32", "shape": [2]}"#, "data_offsets"),
            (r#"{"dtype": "F32", "shape": [2], "data_offsets": [0]}"#, "two integers"),
            (r#"{"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}"#, "two non-negative"),
            (r#"{"dtype": "I64", "shape": [2], "data_offsets": [0, 80]}"#, "outside"),
            ("7", "dtype"),
        ];
        for (e, want) in cases {
            let msg = open_err(&entry(e));
            assert!(msg.contains(want) && msg.contains("'t'"), "{e}: {msg}");
        }
    }

    #[test]
    fn truncations_and_bit_flips_never_panic() {
        let good = sample();
        let dir = TempDir::new("fuzz");
        for cut in 0..good.len() {
            let path = dir.file("t.safetensors", &good[..cut]);
            assert!(SafeTensors::open_file(&path).is_err(), "truncated at {cut} accepted");
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..300 {
            let mut bytes = good.clone();
            for _ in 0..3 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = (seed % bytes.len() as u64) as usize;
                bytes[at] ^= 1 << (seed >> 60 & 7);
            }
            let path = dir.file("f.safetensors", &bytes);
            if let Ok(st) = SafeTensors::open_file(&path) {
                for name in st.names() {
                    let t = st.tensor(name).unwrap();
                    assert_eq!(st.data(t).len(), t.n_elements() * t.dtype.block_bytes());
                }
            }
        }
    }

    #[test]
    fn directory_with_model_safetensors() {
        let dir = TempDir::new("single");
        dir.file(SINGLE_FILE, &sample());
        dir.file("other.safetensors", b"junk that is never opened");
        let st = SafeTensors::open_dir(&dir.0).unwrap();
        assert!(st.tensor("w").is_some());
    }

    #[test]
    fn directory_without_index_takes_all_files() {
        let dir = TempDir::new("loose");
        assert!(matches!(SafeTensors::open_dir(&dir.0), Err(Error::Format(_))));
        dir.file("b.safetensors", &build(&[("y", "F32", &[1], &f32_bytes(&[2.0]))]));
        dir.file("a.safetensors", &build(&[("x", "F32", &[1], &f32_bytes(&[1.0]))]));
        let st = SafeTensors::open_dir(&dir.0).unwrap();
        assert_eq!(st.names().collect::<Vec<_>>(), ["x", "y"]);
        assert_eq!(st.tensor("y").unwrap().file, 1);
        dir.file("c.safetensors", &build(&[("x", "F32", &[1], &f32_bytes(&[3.0]))]));
        let err = SafeTensors::open_dir(&dir.0).err().unwrap().to_string();
        assert!(err.contains("also in an earlier file"), "{err}");
        assert!(SafeTensors::open_dir(&dir.0.join("missing")).is_err());
    }

    #[test]
    fn sharded_directory_through_index() {
        let dir = TempDir::new("shards");
        dir.file(
            "model-00001-of-00002.safetensors",
            &build(&[("a", "F32", &[2], &f32_bytes(&[1.0, 2.0])), ("ids", "I64", &[1], &[0; 8])]),
        );
        dir.file("model-00002-of-00002.safetensors", &build(&[("b", "F16", &[1], &[0, 0x3c])]));
        let index = |map: &str| format!(r#"{{"metadata": {{"total_size": 10}}, "weight_map": {map}}}"#);
        let ok = r#"{"a": "model-00001-of-00002.safetensors", "ids": "model-00001-of-00002.safetensors",
                     "b": "model-00002-of-00002.safetensors"}"#;
        dir.file(INDEX_FILE, index(ok).as_bytes());
        dir.file(SINGLE_FILE, b"the index takes precedence");
        let st = SafeTensors::open_dir(&dir.0).unwrap();
        assert_eq!(st.names().collect::<Vec<_>>(), ["a", "b"]);
        let b = st.tensor("b").unwrap();
        assert_eq!((b.file, st.data(b)), (1, &[0u8, 0x3c][..]));
        assert_eq!(st.mmaps().len(), 2);

        let wrong = r#"{"a": "model-00002-of-00002.safetensors"}"#;
        dir.file(INDEX_FILE, index(wrong).as_bytes());
        let err = SafeTensors::open_dir(&dir.0).err().unwrap().to_string();
        assert!(err.contains("no such tensor"), "{err}");

        let missing = r#"{"a": "model-00009-of-00009.safetensors"}"#;
        dir.file(INDEX_FILE, index(missing).as_bytes());
        assert!(matches!(SafeTensors::open_dir(&dir.0), Err(Error::Io { .. })));

        for bad in [r#"{"a": "../x.safetensors"}"#, r#"{"a": "/etc/passwd"}"#, r#"{"a": 3}"#, "{}", "[]"] {
            dir.file(INDEX_FILE, index(bad).as_bytes());
            assert!(matches!(SafeTensors::open_dir(&dir.0), Err(Error::Format(_))), "{bad}");
        }
        dir.file(INDEX_FILE, b"{ nope");
        assert!(matches!(SafeTensors::open_dir(&dir.0), Err(Error::Format(_))));
    }
}
