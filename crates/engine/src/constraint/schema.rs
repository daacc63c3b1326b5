//! JSON Schema, the subset structured outputs use (OpenAI's `json_schema`
//! response format, pydantic's and zod's schemas), compiled to a graph of
//! nodes that [`super::schema_grammar`] walks byte by byte.
//!
//! Supported: `type` (one or a list), `properties` with `required` (an
//! object's keys come in the order the schema lists them; no other keys),
//! `additionalProperties` as the value schema of a free-keyed object,
//! `items` with `minItems`/`maxItems`, `enum`, `const`, `anyOf`/`oneOf`
//! whose alternatives begin with different bytes (a string, a number, an
//! object, an array, literals), a one-schema `allOf`, `nullable`, and `$ref`
//! into the document (`#/$defs/...`, `#/definitions/...`, recursion
//! included). Keywords that constrain values in ways this grammar does not
//! enforce (`pattern`, `format`, `minLength`, `minimum`, ...) are refused by
//! name, never ignored; annotations (`title`, `description`, ...) are.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// Most containers open at once: the grammar's stack of frames.
pub const MAX_FRAMES: usize = 20;
/// Most properties an object may list, and most values an `enum` may: each
/// set of candidates is a bit mask.
pub const MAX_CHOICES: usize = 64;
/// Most nodes a schema may compile to.
const MAX_NODES: usize = 4096;
/// A node's depth that no value reaches (a required cycle).
const UNREACHABLE: usize = usize::MAX;

/// Keywords that constrain values beyond what the grammar enforces.
const REFUSED: [&str; 26] = [
    "pattern",
    "format",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "uniqueItems",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "if",
    "then",
    "else",
    "not",
    "dependentRequired",
    "dependentSchemas",
    "contains",
    "minContains",
    "maxContains",
    "prefixItems",
    "unevaluatedProperties",
    "unevaluatedItems",
];

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Node {
    /// Listed properties, in order; `{` key `:` value ... `}`.
    Object {
        props: Vec<Prop>,
    },
    /// Any keys, each value of `values`.
    Map {
        values: u16,
    },
    Array {
        items: u16,
        min: u32,
        max: u32,
    },
    String,
    Number {
        integer: bool,
    },
    /// Exactly one of these JSON texts (compact): enum, const, booleans, null.
    Literals(Vec<Vec<u8>>),
    /// One of these, told apart by the first byte.
    Union(Vec<u16>),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Prop {
    /// The name as a JSON string, quotes included.
    pub key: Vec<u8>,
    pub node: u16,
    pub required: bool,
}

/// A compiled schema: its nodes, the root, and per node the fewest
/// containers a value of it needs (so the grammar never opens one it could
/// not close) and the bytes a value of it can start with.
#[derive(Debug)]
pub struct Schema {
    pub(crate) nodes: Vec<Node>,
    pub(crate) root: u16,
    pub(crate) min_depth: Vec<usize>,
    pub(crate) first: Vec<[u64; 4]>,
}

impl Schema {
    /// Compiles a JSON Schema document; the error names the keyword and
    /// where it is (a JSON pointer into the document).
    pub fn compile(doc: &Value) -> Result<Schema, String> {
        let mut c = Compiler { doc, nodes: Vec::new(), refs: HashMap::new(), any: None };
        let root = c.node(doc, "#")?;
        let min_depth = min_depths(&c.nodes);
        if min_depth[root as usize] > MAX_FRAMES {
            return Err(if min_depth[root as usize] == UNREACHABLE {
                "the schema has no finite instance (a required property or item refers back to itself)".into()
            } else {
                format!("the schema nests containers deeper than {MAX_FRAMES}")
            });
        }
        let first = c.nodes.iter().map(|n| first_bytes(&c.nodes, n)).collect();
        let s = Schema { nodes: c.nodes, root, min_depth, first };
        s.check_unions()?;
        Ok(s)
    }

    pub(crate) fn node(&self, i: u16) -> &Node {
        &self.nodes[i as usize]
    }

    pub(crate) fn starts_with(&self, i: u16, b: u8) -> bool {
        self.first[i as usize][b as usize / 64] >> (b % 64) & 1 == 1
    }

    /// What a union's alternative is, for messages (through references).
    fn kind(&self, mut i: u16) -> &'static str {
        for _ in 0..self.nodes.len() {
            match self.node(i) {
                Node::Object { .. } | Node::Map { .. } => return "an object",
                Node::Array { .. } => return "an array",
                Node::String => return "a string",
                Node::Number { .. } => return "a number",
                Node::Literals(_) => return "an enum or const value",
                Node::Union(alts) if alts.len() == 1 => i = alts[0],
                Node::Union(_) => break,
            }
        }
        "a union"
    }

    /// Alternatives must start with different bytes: the grammar picks one at
    /// the first byte and never backtracks.
    fn check_unions(&self) -> Result<(), String> {
        for n in &self.nodes {
            let Node::Union(alts) = n else { continue };
            for (i, &a) in alts.iter().enumerate() {
                for &b in &alts[i + 1..] {
                    let (x, y) = (&self.first[a as usize], &self.first[b as usize]);
                    if let Some(byte) =
                        (0..=255u8).find(|&c| (x[c as usize / 64] & y[c as usize / 64]) >> (c % 64) & 1 == 1)
                    {
                        return Err(format!(
                            "anyOf/oneOf alternatives that start alike are not supported: {} and {} can both start with {:?}",
                            self.kind(a),
                            self.kind(b),
                            byte as char
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

struct Compiler<'a> {
    doc: &'a Value,
    nodes: Vec<Node>,
    /// `$ref` targets already compiled (or being compiled: recursion).
    refs: HashMap<String, u16>,
    /// The node of an unconstrained value, once made.
    any: Option<u16>,
}

impl Compiler<'_> {
    fn push(&mut self, n: Node) -> Result<u16, String> {
        if self.nodes.len() >= MAX_NODES {
            return Err(format!("the schema is too large (over {MAX_NODES} nodes)"));
        }
        self.nodes.push(n);
        Ok((self.nodes.len() - 1) as u16)
    }

    /// Any JSON value: an object of any values, an array of them, a string,
    /// a number, true, false or null.
    fn any(&mut self) -> Result<u16, String> {
        if let Some(a) = self.any {
            return Ok(a);
        }
        let any = self.push(Node::Union(Vec::new()))?;
        self.any = Some(any);
        let alts = vec![
            self.push(Node::Map { values: any })?,
            self.push(Node::Array { items: any, min: 0, max: u32::MAX })?,
            self.push(Node::String)?,
            self.push(Node::Number { integer: false })?,
            self.push(literals(&[Value::Bool(true), Value::Bool(false), Value::Null]))?,
        ];
        self.nodes[any as usize] = Node::Union(alts);
        Ok(any)
    }

    fn node(&mut self, v: &Value, at: &str) -> Result<u16, String> {
        let m = match v {
            Value::Bool(true) => return self.any(),
            Value::Bool(false) => return Err(format!("{at}: the schema `false` has no instance")),
            Value::Object(m) => m,
            _ => return Err(format!("{at}: a schema must be an object or a boolean")),
        };
        if let Some(k) = REFUSED.iter().find(|k| m.contains_key(**k)) {
            return Err(format!("{at}: the keyword `{k}` is not supported"));
        }
        if let Some(r) = m.get("$ref") {
            return self.reference(r, at);
        }
        if m.get("nullable") == Some(&Value::Bool(true)) {
            let mut inner = m.clone();
            inner.remove("nullable");
            let alts = [Value::Object(inner), serde_json::json!({"type": "null"})];
            return self.union(&alts, at);
        }
        if let Some(values) = m.get("enum") {
            let values = values.as_array().ok_or_else(|| format!("{at}/enum: must be a list"))?;
            if values.is_empty() || values.len() > MAX_CHOICES {
                return Err(format!("{at}/enum: must list 1 to {MAX_CHOICES} values"));
            }
            return self.push(literals(values));
        }
        if let Some(value) = m.get("const") {
            return self.push(literals(std::slice::from_ref(value)));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = m.get(key) {
                let alts = alts
                    .as_array()
                    .filter(|a| !a.is_empty())
                    .ok_or_else(|| format!("{at}/{key}: must be a non-empty list"))?;
                return self.union(alts, &format!("{at}/{key}"));
            }
        }
        if let Some(all) = m.get("allOf") {
            return match all.as_array().map(Vec::as_slice) {
                Some([one]) => self.node(one, &format!("{at}/allOf/0")),
                _ => Err(format!("{at}/allOf: only a list of one schema is supported")),
            };
        }
        match m.get("type") {
            Some(Value::String(t)) => self.typed(m, t, at),
            Some(Value::Array(types)) => {
                let alts: Vec<Value> = types
                    .iter()
                    .map(|t| {
                        let mut one = m.clone();
                        one.insert("type".into(), t.clone());
                        Value::Object(one)
                    })
                    .collect();
                self.union(&alts, at)
            }
            Some(_) => Err(format!("{at}/type: must be a string or a list of strings")),
            None if m.contains_key("properties") || m.contains_key("additionalProperties") => {
                self.typed(m, "object", at)
            }
            None if m.contains_key("items") => self.typed(m, "array", at),
            None => self.any(),
        }
    }

    fn typed(&mut self, m: &Map<String, Value>, t: &str, at: &str) -> Result<u16, String> {
        match t {
            "object" => self.object(m, at),
            "array" => {
                let items = match m.get("items") {
                    None => self.any()?,
                    Some(items) => self.node(items, &format!("{at}/items"))?,
                };
                let count = |k: &str, default: u32| -> Result<u32, String> {
                    m.get(k).map_or(Ok(default), |v| {
                        v.as_u64()
                            .map(|n| n.min(u32::MAX as u64) as u32)
                            .ok_or(format!("{at}/{k}: must be a whole number"))
                    })
                };
                let (min, max) = (count("minItems", 0)?, count("maxItems", u32::MAX)?);
                if min > max {
                    return Err(format!("{at}: minItems is over maxItems"));
                }
                self.push(Node::Array { items, min, max })
            }
            "string" => self.push(Node::String),
            "number" => self.push(Node::Number { integer: false }),
            "integer" => self.push(Node::Number { integer: true }),
            "boolean" => self.push(literals(&[Value::Bool(true), Value::Bool(false)])),
            "null" => self.push(literals(&[Value::Null])),
            other => Err(format!("{at}/type: unknown type {other:?}")),
        }
    }

    fn object(&mut self, m: &Map<String, Value>, at: &str) -> Result<u16, String> {
        let extra = m.get("additionalProperties");
        let Some(props) = m.get("properties") else {
            return match extra {
                Some(Value::Bool(false)) => self.push(Node::Object { props: Vec::new() }),
                None | Some(Value::Bool(true)) => {
                    let values = self.any()?;
                    self.push(Node::Map { values })
                }
                Some(values) => {
                    let values = self.node(values, &format!("{at}/additionalProperties"))?;
                    self.push(Node::Map { values })
                }
            };
        };
        if extra.is_some_and(|e| e != &Value::Bool(false)) {
            return Err(format!("{at}: additionalProperties beside properties is not supported (set it false)"));
        }
        let props = props.as_object().ok_or_else(|| format!("{at}/properties: must be an object"))?;
        if props.len() > MAX_CHOICES {
            return Err(format!("{at}/properties: at most {MAX_CHOICES} properties"));
        }
        let required: Vec<&str> = match m.get("required") {
            None => Vec::new(),
            Some(r) => r
                .as_array()
                .and_then(|r| r.iter().map(Value::as_str).collect())
                .ok_or_else(|| format!("{at}/required: must be a list of names"))?,
        };
        if let Some(missing) = required.iter().find(|r| !props.contains_key(**r)) {
            return Err(format!("{at}/required: {missing:?} is not among the properties"));
        }
        // Reserve the node first: a property may refer back to it.
        let me = self.push(Node::Object { props: Vec::new() })?;
        let mut list = Vec::with_capacity(props.len());
        for (name, schema) in props {
            let node = self.node(schema, &format!("{at}/properties/{}", pointer_escape(name)))?;
            let key = serde_json::to_vec(name).map_err(|e| e.to_string())?;
            list.push(Prop { key, node, required: required.contains(&name.as_str()) });
        }
        self.nodes[me as usize] = Node::Object { props: list };
        Ok(me)
    }

    fn union(&mut self, alts: &[Value], at: &str) -> Result<u16, String> {
        // (Nested unions stay nested: one may be a reference still being compiled.)
        let mut nodes = Vec::new();
        for (i, a) in alts.iter().enumerate() {
            nodes.push(self.node(a, &format!("{at}/{i}"))?);
        }
        // Literals merge into one set (enum-like unions of consts).
        let (lits, mut others): (Vec<u16>, Vec<u16>) =
            nodes.into_iter().partition(|&n| matches!(self.nodes[n as usize], Node::Literals(_)));
        if !lits.is_empty() {
            let mut all: Vec<Vec<u8>> = Vec::new();
            for n in lits {
                if let Node::Literals(l) = &self.nodes[n as usize] {
                    all.extend(l.iter().filter(|x| !all.contains(x)).cloned().collect::<Vec<_>>());
                }
            }
            if all.len() > MAX_CHOICES {
                return Err(format!("{at}: at most {MAX_CHOICES} literal values"));
            }
            others.push(self.push(Node::Literals(all))?);
        }
        others.dedup();
        if others.len() == 1 {
            return Ok(others[0]);
        }
        self.push(Node::Union(others))
    }

    fn reference(&mut self, r: &Value, at: &str) -> Result<u16, String> {
        let r = r.as_str().ok_or_else(|| format!("{at}/$ref: must be a string"))?;
        if let Some(&n) = self.refs.get(r) {
            return Ok(n);
        }
        let target = r
            .strip_prefix('#')
            .and_then(|p| self.doc.pointer(p))
            .ok_or_else(|| format!("{at}/$ref: {r:?} does not point into this schema"))?;
        // A placeholder that the target's node replaces, so that recursion
        // through this reference finds it.
        let me = self.push(Node::Union(Vec::new()))?;
        self.refs.insert(r.to_string(), me);
        let n = self.node(target, r)?;
        self.nodes[me as usize] = Node::Union(vec![n]);
        Ok(me)
    }
}

/// A JSON pointer's escaping of one name.
fn pointer_escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn literals(values: &[Value]) -> Node {
    let mut texts: Vec<Vec<u8>> = Vec::new();
    for v in values {
        let t = serde_json::to_vec(v).unwrap_or_default();
        if !texts.contains(&t) {
            texts.push(t);
        }
    }
    Node::Literals(texts)
}

/// The fewest containers a value of each node opens (a fixed point from
/// "unreachable"); a union of one (a resolved reference) is its target's.
fn min_depths(nodes: &[Node]) -> Vec<usize> {
    let mut d = vec![UNREACHABLE; nodes.len()];
    loop {
        let mut changed = false;
        for (i, n) in nodes.iter().enumerate() {
            let at = |j: u16| d[j as usize];
            let v = match n {
                Node::String | Node::Number { .. } | Node::Literals(_) => 0,
                Node::Map { .. } => 1,
                Node::Object { props } => {
                    let deepest = props.iter().filter(|p| p.required).map(|p| at(p.node)).max().unwrap_or(0);
                    deepest.saturating_add(1)
                }
                Node::Array { items, min, .. } => {
                    if *min > 0 {
                        at(*items).saturating_add(1)
                    } else {
                        1
                    }
                }
                Node::Union(alts) => alts.iter().map(|&a| at(a)).min().unwrap_or(UNREACHABLE),
            };
            if v < d[i] {
                d[i] = v;
                changed = true;
            }
        }
        if !changed {
            return d;
        }
    }
}

/// The bytes a value of `n` can start with.
fn first_bytes(nodes: &[Node], n: &Node) -> [u64; 4] {
    let mut set = [0u64; 4];
    let mut add = |b: u8| set[b as usize / 64] |= 1 << (b % 64);
    let mut stack = vec![n];
    let mut seen = 0usize;
    while let Some(n) = stack.pop() {
        seen += 1;
        if seen > nodes.len() + 1 {
            break; // (a union that refers only to itself)
        }
        match n {
            Node::Object { .. } | Node::Map { .. } => add(b'{'),
            Node::Array { .. } => add(b'['),
            Node::String => add(b'"'),
            Node::Number { .. } => b"-0123456789".iter().for_each(|&b| add(b)),
            Node::Literals(l) => l.iter().filter_map(|t| t.first()).for_each(|&b| add(b)),
            Node::Union(alts) => stack.extend(alts.iter().map(|&a| &nodes[a as usize])),
        }
    }
    set
}

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
