//! Kernel sources (`kernels/*.cu`, embedded in the binary) compiled by NVRTC
//! straight to machine code (cubin) for the device's architecture at first
//! use, and cached on disk, keyed by source, options and driver version. A
//! cubin loads with no driver JIT, which the PTX route would pay on every start.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result as nvrtc, sys};

/// Helpers every kernel source starts with.
const COMMON: &str = include_str!("kernels/common.cuh");

/// (module name, source) of every kernel file; attention's flash kernel
/// needs the wgmma wrappers (kernels/wgmma.cuh) in front and its decode
/// kernel on tensor cores follows (kernels/attention_rows_mma.cu); the
/// block-type kernels end with the tensor-core GEMVs (kernels/gemv_tile.cu,
/// then kernels/gemv_tile_b32.cu for the 32-value blocks), whose q/k/v
/// launches need the RoPE epilogue (kernels/rope_kv.cuh), and the persistent decode kernel that runs them (kernels/decode_layers.cu); both
/// modules quantize GEMV inputs (kernels/quantize_x8.cuh).
pub const MODULES: &[(&str, &str)] = &[
    ("ops", include_str!("kernels/ops.cu")),
    (
        "attention",
        concat!(
            include_str!("kernels/wgmma.cuh"),
            include_str!("kernels/quantize_x8.cuh"),
            include_str!("kernels/attention.cu"),
            include_str!("kernels/attention_rows_mma.cu")
        ),
    ),
    ("encoder", include_str!("kernels/encoder.cu")),
    ("gemv", include_str!("kernels/gemv.cu")),
    (
        "quant",
        concat!(
            include_str!("kernels/rope_kv.cuh"),
            include_str!("kernels/quantize_x8.cuh"),
            include_str!("kernels/quant.cu"),
            include_str!("kernels/gemv_tile.cu"),
            include_str!("kernels/gemv_tile_b32.cu"),
            include_str!("kernels/decode_layers.cu"),
            include_str!("kernels/decode_window.cu"),
            include_str!("kernels/mlp_fused.cu")
        ),
    ),
    ("sample", include_str!("kernels/sample.cu")),
];

/// Whether NVRTC's library can be loaded (checked first: a missing library
/// would otherwise panic inside the bindings).
pub fn nvrtc_available() -> bool {
    // SAFETY: only probes for the shared library.
    unsafe { sys::is_culib_present() }
}

fn options(arch: &str) -> Vec<String> {
    let mut o = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    if ferrite_core::env::cuda_trace() {
        o.push("-DFERRITE_TRACE".into());
    }
    if ferrite_core::env::cuda_trace_marks() {
        o.push("-DFERRITE_TRACE_MARKS".into());
    }
    if ferrite_core::env::cuda_sm_busy() {
        o.push("-DSM_BUSY".into());
    }
    o.extend(ferrite_core::env::cuda_defines().into_iter().map(|d| format!("-D{d}")));
    o
}

/// FNV-1a over everything that decides the machine code.
fn cache_key(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0xff]) {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// Compiles one module to a cubin for `arch` (e.g. "sm_90"); the error is the
/// compiler's log.
pub fn compile(name: &str, source: &str, arch: &str) -> Result<Vec<u8>, String> {
    if !nvrtc_available() {
        return Err("NVRTC (libnvrtc) was not found: install the CUDA toolkit or the CUDA 13 NVRTC libraries".into());
    }
    let src = CString::new(format!("{COMMON}\n{source}")).map_err(|e| e.to_string())?;
    let cname = CString::new(format!("{name}.cu")).map_err(|e| e.to_string())?;
    let prog = nvrtc::create_program(&src, Some(&cname)).map_err(|e| format!("nvrtc: {e}"))?;
    // SAFETY: `prog` was just created and is destroyed once, below.
    let out = unsafe {
        match nvrtc::compile_program(prog, &options(arch)) {
            Ok(()) => cubin(prog),
            Err(e) => {
                let log = nvrtc::get_program_log(prog).map(|l| log_text(&l)).unwrap_or_default();
                Err(format!("{name}.cu does not compile for {arch} ({e}):\n{log}"))
            }
        }
    };
    // SAFETY: as above.
    unsafe { nvrtc::destroy_program(prog) }.map_err(|e| format!("nvrtc: {e}"))?;
    out
}

/// SAFETY: `prog` must be a successfully compiled program.
unsafe fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size).result().map_err(|e| format!("nvrtc: {e}"))?;
    let mut buf = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char).result().map_err(|e| format!("nvrtc: {e}"))?;
    Ok(buf)
}

fn log_text(log: &[c_char]) -> String {
    let bytes: Vec<u8> = log.iter().take_while(|&&c| c != 0).flat_map(|c| c.to_ne_bytes()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A module's cubin from the cache in `dir`, compiling and storing it on a miss.
/// `driver` (the driver version) is part of the key: a newer driver may
/// reject or mis-run an older cubin. An unwritable cache only costs time.
pub fn cached(dir: Option<&Path>, name: &str, source: &str, arch: &str, driver: i32) -> Result<Vec<u8>, String> {
    let opts = options(arch).join(" ");
    let key = cache_key(&[COMMON, source, &opts, &driver.to_string()]);
    let path: Option<PathBuf> = dir.map(|d| d.join(format!("{name}-{arch}-{key:016x}.cubin")));
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(bytes);
    }
    let bytes = compile(name, source, arch)?;
    if let (Some(dir), Some(path)) = (dir, path) {
        // Write then rename, so a concurrent reader never sees half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::create_dir_all(dir).is_ok() && std::fs::write(&tmp, &bytes).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(bytes)
}

/// Every module's cubin (`cached`), in the order of `MODULES`, compiled at
/// the same time on threads of their own: NVRTC takes a minute or more for
/// all of them on one core, the first time a model loads on a machine.
pub fn cached_all(dir: Option<&Path>, arch: &str, driver: i32) -> Vec<Result<Vec<u8>, String>> {
    std::thread::scope(|s| {
        let jobs: Vec<_> =
            MODULES.iter().map(|&(name, source)| s.spawn(move || cached(dir, name, source, arch, driver))).collect();
        jobs.into_iter().map(|j| j.join().unwrap_or_else(|_| Err("the kernel compiler failed".into()))).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel compiles for the H200's architecture (its own target
    /// sm_90a, with wgmma, which `Device::open` uses on compute capability
    /// 9.0) and for the A100's (Hopper-only instructions sit behind
    /// `__CUDA_ARCH__` and `FLASH_WG` guards). CI
    /// installs NVRTC (scripts/nvrtc.sh) and sets FERRITE_REQUIRE_NVRTC, so a
    /// kernel that does not compile never lands; elsewhere the test needs the
    /// library.
    #[test]
    fn every_kernel_compiles() {
        if !nvrtc_available() {
            assert!(!ferrite_core::env::require_nvrtc(), "NVRTC is required but was not found");
            eprintln!("NVRTC not found: kernel compilation not checked here");
            return;
        }
        for r in cached_all(None, "sm_80", 0) {
            r.unwrap_or_else(|e| panic!("{e}"));
        }
        for ((name, _), cubin) in MODULES.iter().zip(cached_all(None, "sm_90a", 0)) {
            let cubin = cubin.unwrap_or_else(|e| panic!("{e}"));
            assert!(cubin.starts_with(b"\x7fELF"), "{name}: not a cubin");
            // Every entry point the device loads is in the module's symbols.
            for f in super::super::device::functions(name) {
                let sym = format!("{f}\0");
                let found = cubin.windows(sym.len()).any(|w| w == sym.as_bytes());
                assert!(found, "{name}.cu has no kernel {f}");
            }
        }
    }

    /// Every kernel the sources name outright (not through a macro's `##`)
    /// is one the device loads: a kernel it does not load fails at its first
    /// launch.
    #[test]
    fn every_named_kernel_is_loaded() {
        for (name, src) in MODULES {
            let loaded = super::super::device::functions(name);
            for (at, _) in src.match_indices("extern \"C\" __global__ void") {
                let rest = src[at..].split_once("void").map_or("", |r| r.1).trim_start();
                // Past `__launch_bounds__(...)`, if any.
                let rest = match rest.strip_prefix("__launch_bounds__") {
                    Some(r) => r.split_once(')').map_or("", |r| r.1).trim_start(),
                    None => rest,
                };
                let kernel = rest.split('(').next().unwrap_or("").trim();
                if kernel.contains('#') || kernel.chars().any(|c| c.is_ascii_uppercase()) {
                    continue;
                }
                assert!(loaded.iter().any(|f| f == kernel), "{name}.cu: {kernel} is not in device::FUNCTIONS");
            }
        }
    }

    /// The body of the function whose definition starts at `at`: from its
    /// first brace to the matching one.
    fn body(src: &str, at: usize) -> &str {
        let open = at + src[at..].find('{').expect("a body");
        let mut depth = 0;
        for (i, c) in src[open..].char_indices() {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            if depth == 0 {
                return &src[open..open + i];
            }
        }
        panic!("unbalanced braces")
    }

    /// Every kernel is launched with programmatic dependent launch
    /// (`Device::launch_pdl`), so each must wait for the kernel before it
    /// before it touches data. Checked in the source, comments removed: the
    /// body (or, for a wrapper, the `*_body` function it calls; for a macro
    /// that takes the body as a parameter, every `*_body` in the file) calls
    /// `pdl_wait()` outside any block, and nothing before it indexes memory,
    /// loops or loads (a GEMV's row prefetch into L2 may come first, and reads
    /// of the host's step inputs through `step_input`); or that `*_body` only
    /// dispatches to such bodies.
    #[test]
    fn every_kernel_waits_for_its_input() {
        let waits_early = |b: &str| {
            b.split_once("pdl_wait()").is_some_and(|(head, _)| {
                let depth = head.matches('{').count() as i64 - head.matches('}').count() as i64;
                let touches =
                    ["[", "for (", "for(", "while", "__ldg", "ld.global", "load_"].iter().any(|t| head.contains(t));
                depth == 1 && !touches
            })
        };
        for (name, src) in MODULES {
            let src: String = src
                .replace("\\\n", "\n")
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            let bodies = |called: &str| -> Vec<&str> {
                let macro_param = called.chars().all(|c| c.is_ascii_uppercase() || c == '_');
                src.match_indices("_body(")
                    .map(|(d, _)| (d, &src[..d + 5]))
                    .filter(|(_, def)| {
                        let start = def.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
                        def[..start].ends_with("void ") && (macro_param || &def[start..] == called)
                    })
                    .map(|(d, _)| body(&src, d))
                    .collect()
            };
            let mut kernels = 0;
            for (at, _) in src.match_indices("__global__") {
                let b = body(&src, at);
                let called = b[1..].trim_start().split(['(', '<']).next().unwrap_or("").trim();
                let is_call = !called.is_empty() && called.chars().all(|c| c.is_alphanumeric() || c == '_');
                // A body may itself only pick, by its arguments, which of
                // other bodies that wait early to call (no memory touched first).
                let dispatches = |d: &str| {
                    let calls: Vec<&str> = d
                        .match_indices("_body")
                        .map(|(at, _)| {
                            let start =
                                d[..at].rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
                            &d[start..at + 5]
                        })
                        .collect();
                    let touches = ["[", "for (", "for(", "while", "__ldg", "ld.global", "load_"];
                    !calls.is_empty()
                        && !touches.iter().any(|t| d.contains(t))
                        && calls.iter().all(|c| {
                            let bs = bodies(c);
                            !bs.is_empty() && bs.iter().all(|b| waits_early(b))
                        })
                };
                let delegated = is_call
                    && (called.ends_with("_body") || called.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
                    && {
                        let bs = bodies(called);
                        !bs.is_empty() && bs.iter().all(|d| waits_early(d) || dispatches(d))
                    };
                assert!(
                    waits_early(b) || delegated,
                    "{name}.cu: a kernel does not call pdl_wait() first:\n{}",
                    &b[..b.len().min(300)]
                );
                kernels += 1;
            }
            assert!(kernels > 0, "{name}.cu has no kernels");
        }
    }

    #[test]
    fn cache_key_depends_on_every_part() {
        let base = cache_key(&["a", "b"]);
        assert_ne!(base, cache_key(&["a", "c"]));
        assert_ne!(base, cache_key(&["ab", ""]));
        assert_eq!(base, cache_key(&["a", "b"]));
    }
}
