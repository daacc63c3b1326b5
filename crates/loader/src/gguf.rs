//! GGUF v2/v3 reader: metadata, tensor directory, zero-copy tensor data over mmap.
//!
//! Every count and size read from the file is checked against the bytes that
//! remain before anything is allocated, so a corrupt header yields an error, not
//! a huge allocation or a panic.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrite_core::{DType, Error, Result};
use memmap2::Mmap;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value, with arrays kept typed so a 262k-entry vocabulary stays compact.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(MetaArray),
}

#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    /// Integers of any width, widened.
    Int(Vec<i64>),
    Float(Vec<f64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    /// Arrays of arrays (rare); kept as generic values.
    Nested(Vec<MetaValue>),
}

impl MetaArray {
    pub fn len(&self) -> usize {
        match self {
            MetaArray::Int(v) => v.len(),
            MetaArray::Float(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::Str(v) => v.len(),
            MetaArray::Nested(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl MetaValue {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) if v >= 0 => Some(v as u64),
            MetaValue::I16(v) if v >= 0 => Some(v as u64),
            MetaValue::I32(v) if v >= 0 => Some(v as u64),
            MetaValue::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    /// Short human-readable rendering for `ferrite inspect`.
    pub fn summary(&self) -> String {
        match self {
            MetaValue::Str(s) if s.len() > 80 => {
                format!("{:?}... ({} chars)", &s[..s.floor_char_boundary(60)], s.len())
            }
            MetaValue::Str(s) => format!("{s:?}"),
            MetaValue::Array(a) => format!("[array of {}]", a.len()),
            MetaValue::Bool(b) => b.to_string(),
            MetaValue::F32(v) => v.to_string(),
            MetaValue::F64(v) => v.to_string(),
            other => other.as_u64().map(|v| v.to_string()).unwrap_or_else(|| format!("{other:?}")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: dims[0] is the fastest-varying (row length).
    pub dims: Vec<u64>,
    pub dtype: DType,
    /// Absolute byte offset in the file.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An open GGUF file; tensor bytes are borrowed from the shared mmap.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    mmap: Arc<Mmap>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::format(format!("GGUF header truncated at byte {} (needed {n} more bytes)", self.pos)));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    /// A count that must fit in the rest of the file at `min_bytes` per item.
    fn count(&mut self, what: &str, min_bytes: usize) -> Result<usize> {
        let n = self.u64()?;
        let limit = (self.remaining() / min_bytes.max(1)) as u64;
        if n > limit {
            return Err(Error::format(format!(
                "GGUF {what} count {n} is larger than the file can hold (truncated or corrupt?)"
            )));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> Result<String> {
        let n = self.count("string length", 1)?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::format(format!("GGUF string at byte {} is not UTF-8", self.pos - n)))
    }
}

fn read_value(c: &mut Cursor, ty: u32, depth: u32) -> Result<MetaValue> {
    Ok(match ty {
        0 => MetaValue::U8(c.u8()?),
        1 => MetaValue::I8(c.u8()? as i8),
        2 => MetaValue::U16(c.u16()?),
        3 => MetaValue::I16(c.u16()? as i16),
        4 => MetaValue::U32(c.u32()?),
        5 => MetaValue::I32(c.u32()? as i32),
        6 => MetaValue::F32(f32::from_bits(c.u32()?)),
        7 => MetaValue::Bool(match c.u8()? {
            0 => false,
            1 => true,
            b => return Err(Error::format(format!("GGUF bool has value {b}"))),
        }),
        8 => MetaValue::Str(c.string()?),
        9 => MetaValue::Array(read_array(c, depth)?),
        10 => MetaValue::U64(c.u64()?),
        11 => MetaValue::I64(c.u64()? as i64),
        12 => MetaValue::F64(f64::from_bits(c.u64()?)),
        t => return Err(Error::format(format!("GGUF metadata has unknown value type {t}"))),
    })
}

fn scalar_width(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => 8, // strings (length prefix) and arrays (type + count)
    }
}

fn read_array(c: &mut Cursor, depth: u32) -> Result<MetaArray> {
    if depth > 4 {
        return Err(Error::format("GGUF metadata arrays nested too deeply"));
    }
    let ty = c.u32()?;
    let n = c.count("array", scalar_width(ty))?;
    Ok(match ty {
        0..=5 | 10 | 11 => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                let x = read_value(c, ty, depth)?;
                v.push(match x {
                    MetaValue::I64(i) => i,
                    MetaValue::U64(u) => u as i64,
                    MetaValue::I8(i) => i as i64,
                    MetaValue::I16(i) => i as i64,
                    MetaValue::I32(i) => i as i64,
                    other => other.as_u64().unwrap_or(0) as i64,
                });
            }
            MetaArray::Int(v)
        }
        6 | 12 => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_value(c, ty, depth)?.as_f64().unwrap_or(0.0));
            }
            MetaArray::Float(v)
        }
        7 => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_value(c, ty, depth)?.as_bool().unwrap_or(false));
            }
            MetaArray::Bool(v)
        }
        8 => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(c.string()?);
            }
            MetaArray::Str(v)
        }
        9 => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(MetaValue::Array(read_array(c, depth + 1)?));
            }
            MetaArray::Nested(v)
        }
        t => return Err(Error::format(format!("GGUF array has unknown element type {t}"))),
    })
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only and we never write through the map;
        // a model file changing underneath a running process is not supported.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::parse(path, Arc::new(mmap))
    }

    fn parse(path: &Path, mmap: Arc<Mmap>) -> Result<GgufFile> {
        let ctx = |e: Error| Error::format(format!("{}: {e}", path.display()));
        let mut c = Cursor { buf: &mmap[..], pos: 0 };
        let magic = c.take(4).map_err(|_| ctx(Error::format("file too short to be GGUF")))?;
        if magic != MAGIC {
            return Err(ctx(Error::format("not a GGUF file (bad magic)")));
        }
        let version = c.u32().map_err(ctx)?;
        if !(2..=3).contains(&version) {
            return Err(ctx(Error::format(format!("unsupported GGUF version {version}"))));
        }
        let n_tensors = c.count("tensor", 24).map_err(ctx)?;
        let n_kv = c.count("metadata", 12).map_err(ctx)?;
        let mut metadata = Vec::with_capacity(n_kv);
        let mut meta_index = HashMap::new();
        for _ in 0..n_kv {
            let key = c.string().map_err(ctx)?;
            let ty = c.u32().map_err(ctx)?;
            let val = read_value(&mut c, ty, 0).map_err(ctx)?;
            meta_index.insert(key.clone(), metadata.len());
            metadata.push((key, val));
        }
        let alignment = match meta_index.get("general.alignment") {
            Some(&i) => metadata[i].1.as_u64().unwrap_or(0),
            None => DEFAULT_ALIGNMENT,
        };
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(ctx(Error::format(format!("bad alignment {alignment}"))));
        }
        let mut raw = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = c.string().map_err(ctx)?;
            let n_dims = c.u32().map_err(ctx)?;
            if n_dims == 0 || n_dims > 4 {
                return Err(ctx(Error::format(format!("tensor {name} has {n_dims} dimensions"))));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64().map_err(ctx)?);
            }
            let ty = c.u32().map_err(ctx)?;
            let offset = c.u64().map_err(ctx)?;
            let dtype = DType::from_ggml(ty).ok_or_else(|| {
                ctx(Error::Unsupported(format!("tensor {name} has unknown or unsupported type id {ty}")))
            })?;
            raw.push((name, dims, dtype, offset));
        }
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = mmap.len() as u64;
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut tensor_index = HashMap::new();
        for (name, dims, dtype, rel) in raw {
            let n: u64 = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| ctx(Error::format(format!("tensor {name} has absurd dimensions {dims:?}"))))?;
            if dims[0] % dtype.block_size() as u64 != 0 {
                return Err(ctx(Error::format(format!(
                    "tensor {name}: row length {} is not a multiple of the {dtype} block size",
                    dims[0]
                ))));
            }
            let n_bytes =
                dtype.bytes_for(n).ok_or_else(|| ctx(Error::format(format!("tensor {name} size overflows"))))?;
            let offset = data_start.checked_add(rel).filter(|o| o % alignment == 0 || rel % alignment == 0);
            let end = offset.and_then(|o| o.checked_add(n_bytes));
            match (offset, end) {
                (Some(o), Some(e)) if e <= file_len => {
                    tensor_index.insert(name.clone(), tensors.len());
                    tensors.push(TensorInfo { name, dims, dtype, offset: o, n_bytes });
                }
                _ => {
                    return Err(ctx(Error::format(format!(
                        "tensor {name} data lies past the end of the file (file is {file_len} bytes; truncated?)"
                    ))))
                }
            }
        }
        Ok(GgufFile { path: path.to_path_buf(), version, metadata, meta_index, tensors, tensor_index, mmap })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|v| v.as_str())
    }
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(|v| v.as_u64())
    }
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(|v| v.as_f64())
    }
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(|v| v.as_bool())
    }
    pub fn get_array(&self, key: &str) -> Option<&MetaArray> {
        match self.get(key) {
            Some(MetaValue::Array(a)) => Some(a),
            _ => None,
        }
    }
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
    /// The raw bytes of a tensor, borrowed from the map.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.mmap[info.offset as usize..(info.offset + info.n_bytes) as usize]
    }
    /// The shared map, so weights can borrow it for the life of a model.
    pub fn mmap(&self) -> Arc<Mmap> {
        self.mmap.clone()
    }
}
