//! JSON Schema, the subset structured outputs use (OpenAI's `json_schema`
//! response format, pydantic's and zod's schemas), compiled to a graph of
//! nodes that [`super::schema_grammar`] walks byte by byte.
//!
//! Supported: `type` (one or a list), `properties` with `required` (an
//! object's keys come in the order the schema lists them; no other keys),
//! `additionalProperties` as the value schema of a free-keyed object,
//! `items` with `minItems`/`maxItems`, `minLength`/`maxLength`, a string's
//! `pattern` (its content contains a match) and `format` (`date-time`,
//! `date`, `time`, `duration`, `uuid`, `ipv4`, `ipv6`, `hostname`, `email`,
//! `uri`, `uri-reference`, `json-pointer`, `relative-json-pointer`),
//! `minimum`/`maximum`, the exclusive forms and `multipleOf` (exact;
//! [`super::number`]), `enum`,
//! `const`, `anyOf`/`oneOf` whose alternatives begin with different bytes
//! (a string, a number, an array, literals) or are objects told apart by
//! their first property past those they begin with alike, a one-schema `allOf`, `nullable`, and `$ref` into
//! the document (`#/$defs/...`, `#/definitions/...`, recursion included).
//! Keywords that constrain values in ways this grammar does not enforce
//! (other `format`s, `uniqueItems`, ...), and keywords beside a combinator,
//! are refused by name, never ignored; annotations (`title`,
//! `description`, ...) are ignored.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::number;
use super::pattern::{self, format_max_len, format_pattern, Pattern, PatternUse};

/// Most containers open at once: the grammar's stack of frames.
pub const MAX_FRAMES: usize = 20;
/// Most properties an object may list, and most values an `enum` may: each
/// set of candidates is a bit mask.
pub const MAX_CHOICES: usize = 64;
/// Most nodes a schema may compile to.
const MAX_NODES: usize = 4096;
/// A node's depth that no value reaches (a required cycle).
const UNREACHABLE: usize = usize::MAX;
/// Longest property name or literal, in bytes of JSON.
pub const MAX_LITERAL: usize = 1024;
/// Deepest nesting of schemas (and chains of references) the compiler follows.
const MAX_NESTING: usize = 256;
/// Most automaton states a schema's patterns may have together (1 KiB each).
const MAX_PATTERN_STATES: usize = 8192;

/// Keywords that constrain values beyond what the grammar enforces.
const REFUSED: [&str; 20] = [
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
    "dependencies",
    "$recursiveRef",
    "$dynamicRef",
];

/// Keywords that combine schemas, that list values, and that shape
/// objects or arrays: which may stand together is checked per schema.
const COMBINATORS: [&str; 4] = ["$ref", "anyOf", "oneOf", "allOf"];
const VALUES: [&str; 2] = ["enum", "const"];
const OBJECT_KEYWORDS: [&str; 3] = ["properties", "required", "additionalProperties"];
const ARRAY_KEYWORDS: [&str; 3] = ["items", "minItems", "maxItems"];
/// Keywords of one scalar type: kept only with a `type` they apply to.
const SCALAR_KEYWORDS: [&str; 9] = [
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
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
    /// A string of `min..=max` characters (code points), its content
    /// holding a match of `Schema::patterns[pattern]` if any.
    String {
        min: u32,
        max: u32,
        pattern: Option<u16>,
    },
    /// A number (an integer if `integer`), within `bounds` (inclusive, in
    /// units of 10^-scale: `number::DECIMALS` for a number) and a multiple
    /// of their step, if any.
    Number {
        integer: bool,
        bounds: Option<number::Bounds>,
    },
    /// Exactly one of these JSON texts (compact): enum, const, booleans, null.
    Literals(Vec<Vec<u8>>),
    /// One of these, told apart by the first byte.
    Union(Vec<u16>),
    /// One of these objects, told apart by their first property past the
    /// `shared` ones they all begin with (required, of the same name and
    /// schema): its name, or (the same name) its one `const` value,
    /// `tags[i]` for `alts[i]`. `exclusive` (a `oneOf`): told apart by the
    /// values only.
    Tagged {
        alts: Vec<u16>,
        tags: Vec<Option<Vec<u8>>>,
        shared: u32,
        exclusive: bool,
    },
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
    /// The output is one of the root's literals as raw text (not JSON): no
    /// whitespace before it.
    pub(crate) raw: bool,
    pub(crate) min_depth: Vec<usize>,
    pub(crate) first: Vec<[u64; 4]>,
    /// The strings' patterns (with their lengths).
    pub(crate) patterns: Vec<Pattern>,
}

impl Schema {
    /// Compiles a JSON Schema document; the error names the keyword and
    /// where it is (a JSON pointer into the document).
    pub fn compile(doc: &Value) -> Result<Schema, String> {
        let mut c = Compiler {
            doc,
            nodes: Vec::new(),
            refs: HashMap::new(),
            any: None,
            nesting: 0,
            patterns: Vec::new(),
            pattern_work: pattern::MAX_WORK,
        };
        let root = c.node(doc, "#")?;
        let min_depth = min_depths(&c.nodes);
        if min_depth[root as usize] > MAX_FRAMES {
            return Err(if min_depth[root as usize] == UNREACHABLE {
                "the schema has no finite instance (a required property or item refers back to itself)".into()
            } else {
                format!("the schema nests containers deeper than {MAX_FRAMES}")
            });
        }
        tag_objects(&mut c.nodes, &c.patterns)?;
        let first = (0..c.nodes.len()).map(|i| first_bytes(&c.nodes, i)).collect();
        let s = Schema { nodes: c.nodes, root, raw: false, min_depth, first, patterns: c.patterns };
        s.check_unions()?;
        Ok(s)
    }

    /// The output is exactly one of `choices`, as raw text (vLLM's
    /// `guided_choice`).
    pub fn choice(choices: &[String]) -> Result<Schema, String> {
        if choices.is_empty() || choices.len() > MAX_CHOICES {
            return Err(format!("give 1 to {MAX_CHOICES} choices"));
        }
        if choices.iter().any(|c| c.is_empty() || c.len() > MAX_LITERAL) {
            return Err(format!("each choice must be 1 to {MAX_LITERAL} bytes"));
        }
        let mut texts: Vec<Vec<u8>> = Vec::new();
        for c in choices {
            if !texts.contains(&c.as_bytes().to_vec()) {
                texts.push(c.as_bytes().to_vec());
            }
        }
        let nodes = vec![Node::Literals(texts)];
        let first = vec![first_bytes(&nodes, 0)];
        Ok(Schema { nodes, root: 0, raw: true, min_depth: vec![0], first, patterns: Vec::new() })
    }

    pub(crate) fn node(&self, i: u16) -> &Node {
        &self.nodes[i as usize]
    }

    pub(crate) fn starts_with(&self, i: u16, b: u8) -> bool {
        self.first[i as usize][b as usize / 64] >> (b % 64) & 1 == 1
    }

    /// What a union's alternative is, for messages (through references).
    fn kind(&self, i: u16) -> &'static str {
        match self.node(through_refs(&self.nodes, i)) {
            Node::Object { .. } | Node::Map { .. } | Node::Tagged { .. } => "an object",
            Node::Array { .. } => "an array",
            Node::String { .. } => "a string",
            Node::Number { .. } => "a number",
            Node::Literals(_) => "an enum or const value",
            Node::Union(_) => "a union",
        }
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
    /// Schemas being compiled, one inside another.
    nesting: usize,
    patterns: Vec<Pattern>,
    /// What the patterns' analyses may still take (one budget a schema).
    pattern_work: usize,
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
            self.push(Node::String { min: 0, max: u32::MAX, pattern: None })?,
            self.push(Node::Number { integer: false, bounds: None })?,
            self.push(literals(&[Value::Bool(true), Value::Bool(false), Value::Null], "#")?)?,
        ];
        self.nodes[any as usize] = Node::Union(alts);
        Ok(any)
    }

    /// A string's `pattern` and/or `format` compiled with its lengths, as
    /// an index into the patterns.
    fn string_pattern(&mut self, m: &Map<String, Value>, min: u32, max: u32, at: &str) -> Result<Option<u16>, String> {
        // (A `pattern` beside a `format`: the content matches both.)
        let mut sources = Vec::new();
        if let Some(p) = m.get("pattern") {
            sources.push(p.as_str().ok_or_else(|| format!("{at}/pattern: must be a string"))?.to_string());
        }
        if let Some(f) = m.get("format") {
            let f = f.as_str().ok_or_else(|| format!("{at}/format: must be a string"))?;
            sources.extend(format_pattern(f).ok_or_else(|| {
                format!(
                    "{at}/format: {f:?} is not supported \
                     (date-time, date, time, duration, uuid, ipv4, ipv6, hostname, email, uri, \
                     uri-reference, json-pointer and relative-json-pointer are)"
                )
            })?);
        }
        if sources.is_empty() {
            return Ok(None);
        }
        let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
        let p = Pattern::within(&sources, PatternUse::Json { min, max }, &mut self.pattern_work)
            .map_err(|e| format!("{at}: {e}"))?;
        let states: usize = self.patterns.iter().map(Pattern::states).sum::<usize>() + p.states();
        if states > MAX_PATTERN_STATES {
            return Err(format!(
                "{at}: the schema's patterns need over {MAX_PATTERN_STATES} automaton states together"
            ));
        }
        self.patterns.push(p);
        Ok(Some((self.patterns.len() - 1) as u16))
    }

    fn node(&mut self, v: &Value, at: &str) -> Result<u16, String> {
        if self.nesting >= MAX_NESTING {
            return Err(format!("{at}: schemas (or references) nest deeper than {MAX_NESTING}"));
        }
        self.nesting += 1;
        let n = self.node_inner(v, at);
        self.nesting -= 1;
        n
    }

    fn node_inner(&mut self, v: &Value, at: &str) -> Result<u16, String> {
        let m = match v {
            Value::Bool(true) => return self.any(),
            Value::Bool(false) => return Err(format!("{at}: the schema `false` has no instance")),
            Value::Object(m) => m,
            _ => return Err(format!("{at}: a schema must be an object or a boolean")),
        };
        if let Some(k) = REFUSED.iter().find(|k| m.contains_key(**k)) {
            return Err(format!("{at}: the keyword `{k}` is not supported"));
        }
        if m.get("nullable") == Some(&Value::Bool(true)) {
            let mut inner = m.clone();
            inner.remove("nullable");
            let alts = [Value::Object(inner), serde_json::json!({"type": "null"})];
            return self.union(&alts, at, false);
        }
        let present = |keys: &[&'static str]| -> Vec<&'static str> {
            keys.iter().copied().filter(|k| m.contains_key(*k)).collect()
        };
        let (combinators, values) = (present(&COMBINATORS), present(&VALUES));
        let (objects, arrays) = (present(&OBJECT_KEYWORDS), present(&ARRAY_KEYWORDS));
        let scalars = present(&SCALAR_KEYWORDS);
        let shaped = [&objects[..], &arrays[..], &scalars[..]].concat();
        // Keywords apply together; the grammar follows one kind of schema at a time.
        let beside = |a: &str, b: &str| Err(format!("{at}: `{a}` beside `{b}` is not supported"));
        if let Some(&c) = combinators.first() {
            if let Some(other) = combinators[1..].iter().chain(&values).chain(&shaped).next() {
                return beside(c, other);
            }
            if m.contains_key("type") {
                return beside(c, "type");
            }
            return match c {
                "$ref" => self.reference(&m[c], at),
                "allOf" => match m[c].as_array().map(Vec::as_slice) {
                    Some([one]) => self.node(one, &format!("{at}/allOf/0")),
                    _ => Err(format!("{at}/allOf: only a list of one schema is supported")),
                },
                _ => {
                    let alts = m[c].as_array().filter(|a| !a.is_empty());
                    let alts = alts.ok_or_else(|| format!("{at}/{c}: must be a non-empty list"))?;
                    self.union(alts, &format!("{at}/{c}"), c == "oneOf")
                }
            };
        }
        if let Some(&v) = values.first() {
            if let Some(other) = values[1..].iter().chain(&shaped).next() {
                return beside(v, other);
            }
            let list = match &m[v] {
                Value::Array(list) if v == "enum" => list.clone(),
                _ if v == "enum" => return Err(format!("{at}/enum: must be a list")),
                one => vec![one.clone()],
            };
            // With a `type`, only the values of that type.
            let types = match m.get("type") {
                None => None,
                Some(t) => Some(type_names(t, at)?),
            };
            let list: Vec<Value> = list
                .into_iter()
                .filter(|x| types.as_ref().is_none_or(|ts| ts.iter().any(|t| has_type(x, t))))
                .collect();
            if list.is_empty() || list.len() > MAX_CHOICES {
                return Err(format!("{at}/{v}: must allow 1 to {MAX_CHOICES} values (of its `type`)"));
            }
            let lits = literals(&list, at)?;
            return self.push(lits);
        }
        match m.get("type") {
            Some(t) => {
                let types = type_names(t, at)?;
                if let [one] = types.as_slice() {
                    return self.typed(m, one, at);
                }
                let alts: Vec<Value> = types
                    .iter()
                    .map(|t| {
                        let mut one = m.clone();
                        one.insert("type".into(), Value::String(t.clone()));
                        Value::Object(one)
                    })
                    .collect();
                self.union(&alts, at, false)
            }
            None if !objects.is_empty() && !arrays.is_empty() => beside(objects[0], arrays[0]),
            None if !objects.is_empty() => self.typed(m, "object", at),
            None if !arrays.is_empty() => self.typed(m, "array", at),
            None => match scalars.first() {
                Some(k) => Err(format!("{at}: `{k}` without a `type` is not supported")),
                None => self.any(),
            },
        }
    }

    fn typed(&mut self, m: &Map<String, Value>, t: &str, at: &str) -> Result<u16, String> {
        match t {
            "object" => self.object(m, at),
            "array" => {
                let items = match m.get("items") {
                    None | Some(Value::Bool(false)) => self.any()?,
                    Some(items) => self.node(items, &format!("{at}/items"))?,
                };
                let (min, mut max) = (count(m, "minItems", 0, at)?, count(m, "maxItems", u32::MAX, at)?);
                if m.get("items") == Some(&Value::Bool(false)) {
                    max = 0; // (no item is an instance: only `[]`)
                }
                if min > max {
                    return Err(format!("{at}: minItems is over maxItems"));
                }
                self.push(Node::Array { items, min, max })
            }
            "string" => {
                let format_max = m.get("format").and_then(Value::as_str).map_or(u32::MAX, format_max_len);
                let (min, max) = (count(m, "minLength", 0, at)?, count(m, "maxLength", u32::MAX, at)?.min(format_max));
                if min > max {
                    return Err(format!("{at}: minLength is over maxLength"));
                }
                let pattern = self.string_pattern(m, min, max, at)?;
                self.push(Node::String { min, max, pattern })
            }
            "number" => {
                number_format(m, &["double", "float"], at)?;
                let bounds = number::bounds(m, number::DECIMALS, at)?;
                self.push(Node::Number { integer: false, bounds })
            }
            "integer" => {
                let mut bounds = number::bounds(m, 0, at)?;
                // (A 32- or 64-bit integer: its range, within any bounds given.)
                let width = match number_format(m, &["int32", "int64"], at)? {
                    Some("int32") => Some((i32::MIN as i128, i32::MAX as i128)),
                    Some(_) => Some((i64::MIN as i128, i64::MAX as i128)),
                    None => None,
                };
                if let Some((lo, hi)) = width {
                    let b = bounds.unwrap_or(number::Bounds { lo, hi, step: 1 });
                    let b = number::Bounds { lo: b.lo.max(lo), hi: b.hi.min(hi), ..b };
                    if !b.holds_multiple(b.lo, b.hi) {
                        return Err(format!("{at}: no integer of that format is within the bounds and multipleOf"));
                    }
                    bounds = Some(b);
                }
                self.push(Node::Number { integer: true, bounds })
            }
            "boolean" => self.push(literals(&[Value::Bool(true), Value::Bool(false)], at)?),
            "null" => self.push(literals(&[Value::Null], at)?),
            other => Err(format!("{at}/type: unknown type {other:?}")),
        }
    }

    fn object(&mut self, m: &Map<String, Value>, at: &str) -> Result<u16, String> {
        let extra = m.get("additionalProperties");
        let Some(props) = m.get("properties") else {
            if m.get("required").and_then(Value::as_array).is_some_and(|r| !r.is_empty()) {
                return Err(format!("{at}: `required` without `properties` is not supported (list them)"));
            }
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
            if key.len() > MAX_LITERAL {
                return Err(format!("{at}/properties: a name over {MAX_LITERAL} bytes"));
            }
            list.push(Prop { key, node, required: required.contains(&name.as_str()) });
        }
        self.nodes[me as usize] = Node::Object { props: list };
        Ok(me)
    }

    /// `anyOf` (and `type` lists, `nullable`), or with `exclusive` `oneOf`:
    /// then no value may be an instance of two alternatives, which the
    /// grammar ensures by refusing alternatives that share a value and
    /// objects told apart by name only.
    fn union(&mut self, alts: &[Value], at: &str, exclusive: bool) -> Result<u16, String> {
        let mut nodes = Vec::new();
        for (i, a) in alts.iter().enumerate() {
            let n = self.node(a, &format!("{at}/{i}"))?;
            let n = self.resolved(n);
            match &self.nodes[n as usize] {
                // Nested unions flatten (a reference still being compiled stays whole).
                Node::Union(inner) | Node::Tagged { alts: inner, .. } if !inner.is_empty() => {
                    nodes.extend(inner.iter().map(|&x| self.resolved(x)))
                }
                _ => nodes.push(n),
            }
        }
        let overlap = || Err(format!("{at}: oneOf alternatives that share a value are not supported"));
        // Literals merge into one set (enum-like unions of consts).
        let (lits, others): (Vec<u16>, Vec<u16>) =
            nodes.into_iter().partition(|&n| matches!(self.nodes[n as usize], Node::Literals(_)));
        let mut seen = Vec::new();
        for n in others {
            if seen.contains(&n) && exclusive {
                return overlap();
            }
            if !seen.contains(&n) {
                seen.push(n);
            }
        }
        if !lits.is_empty() {
            let mut all: Vec<Vec<u8>> = Vec::new();
            for n in lits {
                if let Node::Literals(l) = &self.nodes[n as usize] {
                    for x in l {
                        if !all.contains(x) {
                            all.push(x.clone());
                        } else if exclusive {
                            return overlap();
                        }
                    }
                }
            }
            if all.len() > MAX_CHOICES {
                return Err(format!("{at}: at most {MAX_CHOICES} literal values"));
            }
            seen.push(self.push(Node::Literals(all))?);
        }
        // Objects with listed properties: told apart by their first (checked
        // once every node is whole, `tag_objects`).
        let (objects, mut others): (Vec<u16>, Vec<u16>) = seen
            .into_iter()
            .partition(|&n| matches!(&self.nodes[n as usize], Node::Object { props } if !props.is_empty()));
        if objects.len() > MAX_CHOICES {
            return Err(format!("{at}: at most {MAX_CHOICES} objects"));
        }
        match objects.len() {
            0 => {}
            1 => others.push(objects[0]),
            _ => others.push(self.push(Node::Tagged { alts: objects, tags: Vec::new(), shared: 0, exclusive })?),
        }
        if others.len() == 1 {
            return Ok(others[0]);
        }
        self.push(Node::Union(others))
    }

    fn resolved(&self, n: u16) -> u16 {
        through_refs(&self.nodes, n)
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

fn literals(values: &[Value], at: &str) -> Result<Node, String> {
    let mut texts: Vec<Vec<u8>> = Vec::new();
    for v in values {
        let t = serde_json::to_vec(v).map_err(|e| e.to_string())?;
        if t.len() > MAX_LITERAL {
            return Err(format!("{at}: a value over {MAX_LITERAL} bytes of JSON"));
        }
        if !texts.contains(&t) {
            texts.push(t);
        }
    }
    Ok(Node::Literals(texts))
}

/// A count keyword's value (`minItems`, `maxLength`, ...), or `default`.
fn count(m: &Map<String, Value>, k: &str, default: u32, at: &str) -> Result<u32, String> {
    m.get(k).map_or(Ok(default), |v| {
        v.as_u64().map(|n| n.min(u32::MAX as u64) as u32).ok_or(format!("{at}/{k}: must be a whole number"))
    })
}

/// A number's `format`, if it is one of `allowed` (which the caller
/// enforces, or which every JSON number meets); any other is refused.
fn number_format<'a>(m: &'a Map<String, Value>, allowed: &[&str], at: &str) -> Result<Option<&'a str>, String> {
    match m.get("format") {
        None => Ok(None),
        Some(f) => match f.as_str() {
            Some(f) if allowed.contains(&f) => Ok(Some(f)),
            _ => Err(format!("{at}/format: {f} is not supported here (only {})", allowed.join(", "))),
        },
    }
}

/// The names of a `type`: one, or a non-empty list.
fn type_names(t: &Value, at: &str) -> Result<Vec<String>, String> {
    let names: Option<Vec<String>> = match t {
        Value::String(one) => Some(vec![one.clone()]),
        Value::Array(list) if !list.is_empty() => list.iter().map(|x| x.as_str().map(str::to_string)).collect(),
        _ => None,
    };
    names.ok_or_else(|| format!("{at}/type: must be a type's name or a non-empty list of them"))
}

/// Whether `v` is of JSON Schema type `t`.
fn has_type(v: &Value, t: &str) -> bool {
    match (t, v) {
        ("string", Value::String(_)) | ("number", Value::Number(_)) | ("boolean", Value::Bool(_)) => true,
        ("null", Value::Null) | ("object", Value::Object(_)) | ("array", Value::Array(_)) => true,
        ("integer", Value::Number(n)) => n.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// Through resolved references (unions of one) to the node they name; a
/// reference still being compiled (an empty union), or a cycle of them,
/// stays where it is.
fn through_refs(nodes: &[Node], mut n: u16) -> u16 {
    for _ in 0..nodes.len() {
        match &nodes[n as usize] {
            Node::Union(alts) if alts.len() == 1 && alts[0] != n => n = alts[0],
            _ => break,
        }
    }
    n
}

/// Fills each union of objects' tags, checking that the first property
/// past those they share tells its objects apart: required in each, and of
/// different names, or of one name with a different single `const` (or
/// one-value `enum`) each.
fn tag_objects(nodes: &mut [Node], patterns: &[Pattern]) -> Result<(), String> {
    let refuse = |why: String| {
        Err(format!(
            "anyOf/oneOf of objects is supported when a property after those they share tells them apart: {why}"
        ))
    };
    for i in 0..nodes.len() {
        let Node::Tagged { alts, exclusive, .. } = &nodes[i] else { continue };
        let mut props: Vec<&[Prop]> = Vec::new();
        for &a in alts {
            let Node::Object { props: p } = &nodes[a as usize] else {
                return refuse("an alternative is no object".into());
            };
            props.push(p);
        }
        let shared = shared_props(nodes, patterns, &props);
        let mut firsts: Vec<(&[u8], Option<Vec<u8>>)> = Vec::new();
        for ps in &props {
            let Some(p) = ps.get(shared) else {
                return refuse("one has no property past those they share".into());
            };
            if !p.required {
                return refuse(format!("{} is not required", String::from_utf8_lossy(&p.key)));
            }
            let tag = match &nodes[through_refs(nodes, p.node) as usize] {
                Node::Literals(l) if l.len() == 1 => Some(l[0].clone()),
                _ => None,
            };
            if *exclusive && tag.is_none() {
                // (By name alone, a value could hold two alternatives' keys.)
                return refuse(format!("in a oneOf, {} needs a const value", String::from_utf8_lossy(&p.key)));
            }
            for (key, other) in &firsts {
                if *key == &p.key[..] && (tag.is_none() || other.is_none() || tag == *other) {
                    let key = String::from_utf8_lossy(key);
                    return refuse(format!("two have {key} without a different const value"));
                }
            }
            firsts.push((&p.key, tag));
        }
        let tags = firsts.into_iter().map(|(_, t)| t).collect();
        if let Node::Tagged { tags: t, shared: sh, .. } = &mut nodes[i] {
            (*t, *sh) = (tags, shared as u32);
        }
    }
    Ok(())
}

/// How many leading properties every object of a union has alike: required,
/// of one name, of one schema.
fn shared_props(nodes: &[Node], patterns: &[Pattern], props: &[&[Prop]]) -> usize {
    let mut seen = HashMap::new();
    let mut same = |j: usize| {
        let p = &props[0][j];
        props.iter().all(|ps| {
            ps.get(j).is_some_and(|q| q.required && q.key == p.key && alike(nodes, patterns, q.node, p.node, &mut seen))
        })
    };
    (0..props[0].len()).take_while(|&j| same(j)).count()
}

/// Whether two nodes take the same values, compared structurally. `seen`
/// holds each pair's answer once known, and `true` while it is being
/// compared (a cycle of references alike so far is alike), so that each
/// pair is compared once.
fn alike(nodes: &[Node], patterns: &[Pattern], a: u16, b: u16, seen: &mut HashMap<(u16, u16), bool>) -> bool {
    let (a, b) = (through_refs(nodes, a), through_refs(nodes, b));
    if a == b {
        return true;
    }
    if let Some(&known) = seen.get(&(a, b)) {
        return known;
    }
    seen.insert((a, b), true);
    let mut pair = |x: u16, y: u16| alike(nodes, patterns, x, y, seen);
    let same = match (&nodes[a as usize], &nodes[b as usize]) {
        (Node::Object { props: x }, Node::Object { props: y }) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|(p, q)| p.key == q.key && p.required == q.required && pair(p.node, q.node))
        }
        (&Node::Map { values: x }, &Node::Map { values: y }) => pair(x, y),
        (&Node::Array { items: x, min, max }, &Node::Array { items: y, min: m2, max: x2 }) => {
            (min, max) == (m2, x2) && pair(x, y)
        }
        (Node::Union(x), Node::Union(y)) => x.len() == y.len() && x.iter().zip(y).all(|(&x, &y)| pair(x, y)),
        // (Patterns compiled from one source have one table.)
        (&Node::String { min, max, pattern: Some(p) }, &Node::String { min: m2, max: x2, pattern: Some(q) }) => {
            (min, max) == (m2, x2) && patterns[p as usize] == patterns[q as usize]
        }
        (Node::Tagged { .. }, _) | (_, Node::Tagged { .. }) => false,
        (x, y) => x == y,
    };
    seen.insert((a, b), same);
    same
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
                Node::String { .. } | Node::Number { .. } | Node::Literals(_) => 0,
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
                Node::Union(alts) | Node::Tagged { alts, .. } => {
                    alts.iter().map(|&a| at(a)).min().unwrap_or(UNREACHABLE)
                }
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

/// The bytes a value of node `n` can start with.
fn first_bytes(nodes: &[Node], n: usize) -> [u64; 4] {
    let mut set = [0u64; 4];
    let mut add = |b: u8| set[b as usize / 64] |= 1 << (b % 64);
    let mut seen = vec![false; nodes.len()];
    let mut stack = vec![n];
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        match &nodes[i] {
            Node::Object { .. } | Node::Map { .. } | Node::Tagged { .. } => add(b'{'),
            Node::Array { .. } => add(b'['),
            Node::String { .. } => add(b'"'),
            Node::Number { .. } => b"-0123456789".iter().for_each(|&b| add(b)),
            Node::Literals(l) => l.iter().filter_map(|t| t.first()).for_each(|&b| add(b)),
            Node::Union(alts) => stack.extend(alts.iter().map(|&a| a as usize)),
        }
    }
    set
}

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
