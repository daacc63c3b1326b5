//! Model-source resolution: from the MODEL argument to a file or directory.
//!
//! A MODEL argument may be a `.gguf` path, a Hugging Face layout directory (or a
//! `.safetensors` / `config.json` file inside one), a repository of the local
//! Hugging Face cache given as `org/name` (optionally `org/name/file.gguf`), or a
//! short name in ferrite's model directory. This module holds every
//! environment-variable read of the loader; the logic below takes the roots as
//! parameters so it is testable without touching the process environment.

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use ferrite_core::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    Gguf(PathBuf),
    HfDir(PathBuf),
    /// `random:PRESET`: random weights of a known model's shape, for benchmarks.
    Random(String),
}

/// One model found by `list_models`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelEntry {
    /// What to pass as MODEL to get this model back.
    pub name: String,
    pub path: PathBuf,
    pub bytes: u64,
    /// "gguf", "safetensors", or "hf" (a Hugging Face layout without safetensors).
    pub format: &'static str,
}

/// Resolves a MODEL argument; see the module docs for the accepted forms.
pub fn resolve(arg: &str) -> Result<ModelSource> {
    if let Some(preset) = arg.strip_prefix("random:") {
        return Ok(ModelSource::Random(preset.to_string()));
    }
    resolve_in(arg, &Roots::from_env())
}

/// `$FERRITE_HOME/models`, default `~/.ferrite/models`.
pub fn models_dir() -> PathBuf {
    Roots::from_env().models_dir
}

/// The models of ferrite's model directory, then those of the Hugging Face cache.
pub fn list_models() -> Result<Vec<ModelEntry>> {
    list_in(&Roots::from_env())
}

/// Where models are looked up.
#[derive(Clone, Debug)]
struct Roots {
    models_dir: PathBuf,
    hf_hub: PathBuf,
}

impl Roots {
    fn from_env() -> Roots {
        Roots::from_vars(ferrite_core::env::var)
    }

    /// huggingface_hub's rules: HF_HUB_CACHE (or its legacy name), else
    /// HF_HOME/hub, else $XDG_CACHE_HOME or ~/.cache, + huggingface/hub.
    fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Roots {
        let get = |key: &str| var(key).filter(|v| !v.is_empty()).map(PathBuf::from);
        let home = get("HOME").unwrap_or_else(|| PathBuf::from("."));
        let ferrite_home = get("FERRITE_HOME").unwrap_or_else(|| home.join(".ferrite"));
        let hf_hub = get("HF_HUB_CACHE")
            .or_else(|| get("HUGGINGFACE_HUB_CACHE"))
            .or_else(|| get("HF_HOME").map(|h| h.join("hub")))
            .unwrap_or_else(|| {
                get("XDG_CACHE_HOME").unwrap_or_else(|| home.join(".cache")).join("huggingface").join("hub")
            });
        Roots { models_dir: ferrite_home.join("models"), hf_hub }
    }
}

fn resolve_in(arg: &str, roots: &Roots) -> Result<ModelSource> {
    if arg.trim().is_empty() {
        return Err(Error::InvalidInput("no model given".into()));
    }
    let path = Path::new(arg);
    if path.exists() {
        return from_path(path);
    }
    let mut tried = vec![format!("path {arg}")];

    if let Some(repo) = RepoId::parse(arg) {
        let repo_dir = roots.hf_hub.join(repo.cache_dir_name());
        if repo_dir.is_dir() {
            let snapshot = snapshot_dir(&repo_dir)?;
            return match &repo.file {
                Some(file) => from_path(&snapshot.join(file)),
                None => from_dir(&snapshot),
            };
        }
        tried.push(format!("Hugging Face cache {}", repo_dir.display()));
    }

    if is_short_name(arg) {
        let mut candidates = vec![roots.models_dir.join(arg)];
        if !arg.ends_with(".gguf") {
            candidates.insert(0, roots.models_dir.join(format!("{arg}.gguf")));
        }
        for candidate in candidates {
            if candidate.exists() {
                return from_path(&candidate);
            }
            tried.push(candidate.display().to_string());
        }
    }
    Err(Error::InvalidInput(format!("model '{arg}' not found; tried {}", tried.join(", "))))
}

/// An existing file or directory.
fn from_path(path: &Path) -> Result<ModelSource> {
    let meta = fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        return from_dir(path);
    }
    // A pipe or device would block the reader forever, or never end.
    if !meta.is_file() {
        return Err(Error::InvalidInput(format!("{}: not a regular file or a directory", path.display())));
    }
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("gguf") => Ok(ModelSource::Gguf(path.to_path_buf())),
        Some("safetensors") | Some("json") => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if parent.join("config.json").is_file() {
                Ok(ModelSource::HfDir(parent.to_path_buf()))
            } else {
                Err(Error::InvalidInput(format!(
                    "{}: no config.json next to it, so it is not a Hugging Face model directory",
                    path.display()
                )))
            }
        }
        _ if has_gguf_magic(path) => Ok(ModelSource::Gguf(path.to_path_buf())),
        _ => Err(Error::Unsupported(format!("{}: not a .gguf or .safetensors model file", path.display()))),
    }
}

/// A directory: Hugging Face layout (config.json), a Hugging Face cache repo
/// folder (`models--org--name`), or a folder holding exactly one `.gguf`.
fn from_dir(dir: &Path) -> Result<ModelSource> {
    if dir.join("config.json").is_file() {
        return Ok(ModelSource::HfDir(dir.to_path_buf()));
    }
    if dir.join("snapshots").is_dir() {
        return from_dir(&snapshot_dir(dir)?);
    }
    let ggufs = gguf_files(dir)?;
    match &ggufs[..] {
        [one] => Ok(ModelSource::Gguf(one.clone())),
        [] => Err(Error::InvalidInput(format!(
            "{}: neither a Hugging Face model directory (no config.json) nor a folder with a .gguf file",
            dir.display()
        ))),
        many => Err(Error::InvalidInput(format!(
            "{}: several .gguf files ({}); name the one to use",
            dir.display(),
            many.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

fn gguf_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
        .collect();
    out.sort();
    Ok(out)
}

fn has_gguf_magic(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

/// `snapshots/<hash>` of a Hugging Face cache repo folder: the commit `refs/main`
/// names, else the only snapshot, else the most recently modified one.
fn snapshot_dir(repo_dir: &Path) -> Result<PathBuf> {
    let snapshots = repo_dir.join("snapshots");
    if let Ok(hash) = fs::read_to_string(repo_dir.join("refs").join("main")) {
        let hash = hash.trim();
        if is_plain_name(hash) && snapshots.join(hash).is_dir() {
            return Ok(snapshots.join(hash));
        }
    }
    let entries = fs::read_dir(&snapshots).map_err(|e| Error::io(&snapshots, e))?;
    let newest = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| (e.metadata().and_then(|m| m.modified()).ok(), e.file_name()));
    newest
        .map(|e| e.path())
        .ok_or_else(|| Error::InvalidInput(format!("{}: no downloaded snapshot", snapshots.display())))
}

/// `org/name` or `org/name/path/in/repo`, with names as the Hub allows them.
#[derive(Debug, PartialEq, Eq)]
struct RepoId {
    org: String,
    name: String,
    file: Option<PathBuf>,
}

impl RepoId {
    fn parse(arg: &str) -> Option<RepoId> {
        let mut parts = arg.split('/');
        let org = parts.next()?;
        let name = parts.next()?;
        let valid = |s: &str| {
            !s.is_empty()
                && !s.starts_with(['.', '-'])
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        if !valid(org) || !valid(name) {
            return None;
        }
        let rest: Vec<&str> = parts.collect();
        if rest.iter().any(|p| !is_plain_name(p)) {
            return None;
        }
        Some(RepoId { org: org.into(), name: name.into(), file: (!rest.is_empty()).then(|| rest.iter().collect()) })
    }

    fn cache_dir_name(&self) -> String {
        format!("models--{}--{}", self.org, self.name)
    }
}

/// One normal path component: no separators, not `.` or `..`.
fn is_plain_name(s: &str) -> bool {
    let mut parts = Path::new(s).components();
    matches!((parts.next(), parts.next()), (Some(Component::Normal(c)), None) if c == s)
}

fn is_short_name(arg: &str) -> bool {
    is_plain_name(arg) && !arg.contains('\\')
}

// --- listing ---------------------------------------------------------------------

fn list_in(roots: &Roots) -> Result<Vec<ModelEntry>> {
    let mut out = Vec::new();
    for (name, path) in sorted_entries(&roots.models_dir)? {
        if path.is_dir() {
            if let Some(entry) = describe_dir(&name, &path) {
                out.push(entry);
            }
        } else if let Some(stem) = name.strip_suffix(".gguf").filter(|_| path.is_file()) {
            // (is_file: not a dangling link)
            out.push(gguf_entry(stem.to_string(), path));
        }
    }
    for (dir_name, path) in sorted_entries(&roots.hf_hub)? {
        let Some(repo) = dir_name.strip_prefix("models--") else {
            continue;
        };
        let Some((org, name)) = repo.split_once("--") else {
            continue;
        };
        let Ok(snapshot) = snapshot_dir(&path) else {
            continue;
        };
        let repo_name = format!("{org}/{name}");
        if snapshot.join("config.json").is_file() {
            out.extend(describe_dir(&repo_name, &snapshot));
            continue;
        }
        // A GGUF repo often holds several quantizations: list each file.
        let files = gguf_files(&snapshot).unwrap_or_default();
        let single = files.len() == 1;
        for file in files {
            let file_name = file.file_name().unwrap_or_default().to_string_lossy().into_owned();
            let name = if single { repo_name.clone() } else { format!("{repo_name}/{file_name}") };
            out.push(gguf_entry(name, file));
        }
    }
    Ok(out)
}

/// (file name, path) of a directory's entries, sorted; a missing directory is empty.
fn sorted_entries(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut out: Vec<(String, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .filter(|(name, _)| !name.starts_with('.'))
        .collect();
    out.sort();
    Ok(out)
}

fn gguf_entry(name: String, path: PathBuf) -> ModelEntry {
    let bytes = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    ModelEntry { name, path, bytes, format: "gguf" }
}

/// A model directory as a list entry; `None` when it holds no model.
fn describe_dir(name: &str, dir: &Path) -> Option<ModelEntry> {
    match from_dir(dir).ok()? {
        ModelSource::Gguf(file) => Some(gguf_entry(name.to_string(), file)),
        ModelSource::HfDir(dir) => {
            let has_safetensors = fs::read_dir(&dir)
                .ok()?
                .filter_map(|e| e.ok())
                .any(|e| e.path().extension().is_some_and(|x| x == "safetensors"));
            Some(ModelEntry {
                name: name.to_string(),
                bytes: dir_bytes(&dir, 4),
                path: dir,
                format: if has_safetensors { "safetensors" } else { "hf" },
            })
        }
        ModelSource::Random(_) => None,
    }
}

/// Total size of the files under `dir`, following links (the HF cache links
/// snapshot files to blobs); `depth` bounds the walk against link cycles.
fn dir_bytes(dir: &Path, depth: usize) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match fs::metadata(e.path()) {
            Ok(m) if m.is_dir() && depth > 0 => dir_bytes(&e.path(), depth - 1),
            Ok(m) if m.is_file() => m.len(),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TempDir;

    impl TempDir {
        fn roots(&self) -> Roots {
            Roots { models_dir: self.0.join("models"), hf_hub: self.0.join("hub") }
        }
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    #[test]
    fn roots_follow_huggingface_hub_rules() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            Roots::from_vars(move |k| pairs.iter().find(|(key, _)| *key == k).map(|(_, v)| v.into()))
        };
        let r = vars(&[("HOME", "/h")]);
        assert_eq!(r.models_dir, Path::new("/h/.ferrite/models"));
        assert_eq!(r.hf_hub, Path::new("/h/.cache/huggingface/hub"));
        let r = vars(&[("HOME", "/h"), ("FERRITE_HOME", "/f"), ("XDG_CACHE_HOME", "/x")]);
        assert_eq!(r.models_dir, Path::new("/f/models"));
        assert_eq!(r.hf_hub, Path::new("/x/huggingface/hub"));
        let r = vars(&[("HOME", "/h"), ("HF_HOME", "/hf"), ("XDG_CACHE_HOME", "/x")]);
        assert_eq!(r.hf_hub, Path::new("/hf/hub"));
        let r = vars(&[("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/cache"), ("FERRITE_HOME", "")]);
        assert_eq!(r.hf_hub, Path::new("/cache"));
        assert_eq!(r.models_dir, Path::new("./.ferrite/models"));
        let r = vars(&[("HUGGINGFACE_HUB_CACHE", "/legacy"), ("HF_HOME", "/hf")]);
        assert_eq!(r.hf_hub, Path::new("/legacy"));
    }

    #[test]
    fn paths_resolve_by_kind() {
        let t = TempDir::new("paths");
        let roots = t.roots();
        let gguf = t.file("a/model.gguf", b"GGUF....");
        assert_eq!(resolve_in(s(&gguf), &roots).unwrap(), ModelSource::Gguf(gguf.clone()));
        // A single .gguf in a folder stands for the folder.
        assert_eq!(resolve_in(s(&t.0.join("a")), &roots).unwrap(), ModelSource::Gguf(gguf));
        let renamed = t.file("b/model.bin", b"GGUF\x03\0\0\0");
        assert_eq!(resolve_in(s(&renamed), &roots).unwrap(), ModelSource::Gguf(renamed));

        let hf = t.0.join("hf");
        let st = t.file("hf/model.safetensors", b"");
        assert!(matches!(resolve_in(s(&st), &roots), Err(Error::InvalidInput(_))));
        t.file("hf/config.json", b"{}");
        assert_eq!(resolve_in(s(&hf), &roots).unwrap(), ModelSource::HfDir(hf.clone()));
        assert_eq!(resolve_in(s(&st), &roots).unwrap(), ModelSource::HfDir(hf.clone()));
        assert_eq!(resolve_in(s(&hf.join("config.json")), &roots).unwrap(), ModelSource::HfDir(hf));

        t.file("two/x.gguf", b"GGUF");
        t.file("two/y.gguf", b"GGUF");
        let err = resolve_in(s(&t.0.join("two")), &roots).unwrap_err().to_string();
        assert!(err.contains("x.gguf, y.gguf"), "{err}");
        fs::create_dir_all(t.0.join("empty")).unwrap();
        assert!(matches!(resolve_in(s(&t.0.join("empty")), &roots), Err(Error::InvalidInput(_))));
        let txt = t.file("notes.txt", b"hello");
        assert!(matches!(resolve_in(s(&txt), &roots), Err(Error::Unsupported(_))));
        assert!(matches!(resolve_in("  ", &roots), Err(Error::InvalidInput(_))));
        // A device (or a pipe) would block or never end: refused before it is opened.
        if Path::new("/dev/null").exists() {
            let err = resolve_in("/dev/null", &roots).unwrap_err().to_string();
            assert!(err.contains("not a regular file"), "{err}");
        }
    }

    #[test]
    fn short_names_come_from_the_models_dir() {
        let t = TempDir::new("short");
        let roots = t.roots();
        let gguf = t.file("models/smol.gguf", b"GGUF");
        t.file("models/minilm/config.json", b"{}");
        t.file("models/minilm/model.safetensors", b"12345678");
        assert_eq!(resolve_in("smol", &roots).unwrap(), ModelSource::Gguf(gguf.clone()));
        assert_eq!(resolve_in("smol.gguf", &roots).unwrap(), ModelSource::Gguf(gguf));
        let minilm = roots.models_dir.join("minilm");
        assert_eq!(resolve_in("minilm", &roots).unwrap(), ModelSource::HfDir(minilm));

        let err = resolve_in("nothing", &roots).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::InvalidInput(_)));
        assert!(msg.contains("nothing.gguf") && msg.contains("path nothing"), "{msg}");
    }

    #[test]
    fn huggingface_cache_repos() {
        let t = TempDir::new("hub");
        let roots = t.roots();
        let repo = t.0.join("hub/models--org--tiny");
        t.file("hub/models--org--tiny/snapshots/old/config.json", b"{}");
        t.file("hub/models--org--tiny/snapshots/abc123/config.json", b"{}");
        t.file("hub/models--org--tiny/snapshots/abc123/model.safetensors", b"1234");
        t.file("hub/models--org--tiny/refs/main", b"abc123\n");
        let snap = repo.join("snapshots/abc123");
        assert_eq!(resolve_in("org/tiny", &roots).unwrap(), ModelSource::HfDir(snap.clone()));
        // The cache folder itself works as a path too.
        assert_eq!(resolve_in(s(&repo), &roots).unwrap(), ModelSource::HfDir(snap));

        // Without refs/main: the only snapshot.
        t.file("hub/models--org--q-GGUF/snapshots/h1/m-Q4_K_M.gguf", b"GGUF");
        t.file("hub/models--org--q-GGUF/snapshots/h1/m-Q8_0.gguf", b"GGUF");
        let err = resolve_in("org/q-GGUF", &roots).unwrap_err().to_string();
        assert!(err.contains("m-Q4_K_M.gguf, m-Q8_0.gguf"), "{err}");
        let q8 = t.0.join("hub/models--org--q-GGUF/snapshots/h1/m-Q8_0.gguf");
        assert_eq!(resolve_in("org/q-GGUF/m-Q8_0.gguf", &roots).unwrap(), ModelSource::Gguf(q8));

        let err = resolve_in("org/absent", &roots).unwrap_err().to_string();
        assert!(err.contains("models--org--absent"), "{err}");
        assert!(RepoId::parse("org/../x").is_none());
        assert!(RepoId::parse("/abs/path").is_none());
        assert!(RepoId::parse("org/").is_none());
        assert_eq!(RepoId::parse("a/b/c/d.gguf").unwrap().file, Some(PathBuf::from("c/d.gguf")));

        fs::create_dir_all(t.0.join("hub/models--org--none/snapshots")).unwrap();
        assert!(resolve_in("org/none", &roots).unwrap_err().to_string().contains("no downloaded snapshot"));
    }

    #[test]
    fn listing_covers_models_dir_and_cache() {
        let t = TempDir::new("list");
        let roots = t.roots();
        assert_eq!(list_in(&roots).unwrap(), Vec::new());

        t.file("models/b.gguf", &[0; 10]);
        t.file("models/b.gguf.tmp", &[0; 10]);
        t.file("models/a/config.json", &[0; 2]);
        t.file("models/a/model.safetensors", &[0; 8]);
        t.file("models/a/sub/extra.json", &[0; 5]);
        t.file("models/c/only.gguf", &[0; 3]);
        t.file("models/junk/readme.md", b"x");
        t.file("hub/models--org--tiny/snapshots/h/config.json", &[0; 2]);
        t.file("hub/models--org--g/snapshots/h/x.gguf", &[0; 4]);
        t.file("hub/models--org--g/snapshots/h/y.gguf", &[0; 6]);
        t.file("hub/datasets--org--d/snapshots/h/data.json", b"{}");

        let got: Vec<(String, u64, &str)> =
            list_in(&roots).unwrap().into_iter().map(|e| (e.name, e.bytes, e.format)).collect();
        let want = [
            ("a", 15, "safetensors"),
            ("b", 10, "gguf"),
            ("c", 3, "gguf"),
            ("org/g/x.gguf", 4, "gguf"),
            ("org/g/y.gguf", 6, "gguf"),
            ("org/tiny", 2, "hf"),
        ];
        let want: Vec<(String, u64, &str)> = want.iter().map(|(n, b, f)| (n.to_string(), *b, *f)).collect();
        assert_eq!(got, want);
        // Every listed name resolves back.
        for entry in list_in(&roots).unwrap() {
            assert!(resolve_in(&entry.name, &roots).is_ok(), "{}", entry.name);
        }
    }
}
