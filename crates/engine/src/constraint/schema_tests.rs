//! The schema compiler's refusals, and its grammar on chosen documents and
//! on random walks: every walk's output either goes on or is a whole value
//! that a small independent validator accepts.

use serde_json::{json, Value};

use super::super::picker;
use super::super::schema_grammar::SchemaState;
use super::*;

fn compile(v: Value) -> Schema {
    Schema::compile(&v).unwrap_or_else(|e| panic!("{v}: {e}"))
}

/// Feeds `doc`; the state, or the index of the first byte refused.
fn feed(s: &Schema, doc: &[u8]) -> Result<SchemaState, usize> {
    let mut st = SchemaState::start(s);
    for (i, &b) in doc.iter().enumerate() {
        st = st.step(s, b).ok_or(i)?;
    }
    Ok(st)
}

fn accepts(s: &Schema, doc: &str) -> bool {
    feed(s, doc.as_bytes()).is_ok_and(|st| st.complete(s))
}

fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "email": {"type": ["string", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
            "role": {"enum": ["admin", "user", 3]}
        },
        "required": ["name", "age", "role"],
        "additionalProperties": false
    })
}

#[test]
fn objects_in_order_with_required_and_optional_keys() {
    let s = compile(person());
    for doc in [
        r#"{"name":"Ann","age":31,"role":"admin"}"#,
        r#"{ "name" : "Ann" , "age" : -4 , "email" : null , "role" : 3 }"#,
        r#"{"name":"Ann","age":0,"tags":["a","b"],"role":"user"}"#,
        r#"{"name":"A\"\u00e9","age":7,"email":"a@b","tags":[],"role":"user"}"#,
    ] {
        assert!(accepts(&s, doc), "{doc}");
    }
    let refused = [
        (r#"{"age":1"#, 2),                                        // out of order: name comes first
        (r#"{"name":"A"}"#, 11),                                   // age and role are required
        (r#"{"name":"A","age":1.5"#, 19),                          // an integer
        (r#"{"name":"A","age":01"#, 19),                           // no leading zeros
        (r#"{"name":"A","age":1,"role":"guest"#, 28),              // not in the enum
        (r#"{"name":"A","age":1,"role":"user","x"#, 33),           // no other keys
        (r#"{"name":"A","age":1,"tags":["a","b","c"#, 35),         // maxItems 2
        (r#"{"name":"A","age":1,"role":"user","email":null"#, 33), // email comes before role
    ];
    for (doc, at) in refused {
        assert_eq!(feed(&s, doc.as_bytes()).err(), Some(at), "{doc}");
    }
    // A whole value: nothing but the end may follow, not even whitespace.
    let st = feed(&s, br#"{"name":"A","age":1,"role":3}"#).unwrap();
    assert!(st.is_done() && st.step(&s, b' ').is_none());
}

#[test]
fn refs_unions_maps_and_arrays() {
    // A recursive tree through $defs, its children optional.
    let tree = compile(json!({
        "$ref": "#/$defs/node",
        "$defs": {"node": {"type": "object", "properties": {
            "value": {"type": "number"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
        }, "required": ["value"]}}
    }));
    assert!(accepts(&tree, r#"{"value":1.5e3,"children":[{"value":-0.25},{"value":2,"children":[]}]}"#));
    assert!(!accepts(&tree, r#"{"value":1,"children":[{}]}"#));
    // Free keys with typed values; a nullable via anyOf; a root array with minItems.
    let map = compile(json!({"type": "object", "additionalProperties": {"type": "integer"}}));
    assert!(accepts(&map, r#"{"a":1,"b c":-2}"#) && accepts(&map, "{}"));
    assert_eq!(feed(&map, br#"{"a":"x"#).err(), Some(5));
    let list =
        compile(json!({"type": "array", "minItems": 2, "items": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}}));
    assert!(accepts(&list, "[true,null]"));
    assert_eq!(feed(&list, b"[true]").err(), Some(5));
    // Any value where the schema says nothing; a top-level number ends with the output.
    let any = compile(json!({}));
    assert!(accepts(&any, r#"{"a":[1,{"b":null}],"c":"d"}"#) && accepts(&any, "12"));
    let num = compile(json!({"type": "integer"}));
    let st = feed(&num, b"12").unwrap();
    assert!(st.complete(&num) && !st.is_done() && st.step(&num, b'3').is_some());
    // const, and enum values that are prefixes of one another.
    let c = compile(json!({"enum": [1, 12, "x"]}));
    assert!(accepts(&c, "1") && accepts(&c, "12") && accepts(&c, "\"x\"") && !accepts(&c, "2"));
}

#[test]
fn refusals_name_the_problem() {
    let cases = [
        (json!({"type": "string", "pattern": "(?=a)a"}), "look-around"),
        (json!({"type": "string", "pattern": "^abc$", "maxLength": 2}), "no match that fits"),
        (json!({"type": "string", "pattern": "^a", "format": "date"}), "no match that fits"),
        (json!({"type": "string", "pattern": "^@", "format": "email"}), "no match that fits"),
        (json!({"pattern": "a"}), "`pattern` without a `type`"),
        (json!({"type": "integer", "format": "uint8"}), "format"),
        (json!({"type": "string", "maxLength": -1}), "maxLength"),
        (json!({"type": "string", "format": "idn-email"}), "\"idn-email\" is not supported"),
        (json!({"$ref": "#/$defs/missing"}), "does not point"),
        (json!({"anyOf": [{"type": "object"}, {"type": "object", "properties": {}}]}), "start alike"),
        (json!({"anyOf": [{"type": "string"}, {"enum": ["a"]}]}), "start alike"),
        (json!({"type": "object", "properties": {"a": {}}, "additionalProperties": true}), "additionalProperties"),
        (json!({"type": "object", "properties": {"a": {}}, "required": ["b"]}), "\"b\""),
        (
            json!({"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
            "required": ["n"]}}}),
            "no finite instance",
        ),
        (json!({"type": "list"}), "unknown type"),
        (json!({"enum": []}), "enum"),
        (json!(false), "no instance"),
        (json!({"allOf": [{}, {}]}), "allOf"),
        (json!({"type": []}), "type"),
        (json!({"type": "object", "required": ["a"]}), "`required` without `properties`"),
        (json!({"$ref": "#/$defs/a", "nullable": false, "required": ["x"], "$defs": {"a": {}}}), "beside"),
        (json!({"anyOf": [{}], "properties": {}}), "beside"),
        (json!({"enum": ["a"], "const": "a"}), "beside"),
        (json!({"type": "string", "enum": [1, 2]}), "enum"),
        (json!({"enum": ["x".repeat(MAX_LITERAL)]}), "bytes"),
        (json!({"$dynamicRef": "#a"}), "`$dynamicRef`"),
    ];
    for (schema, want) in cases {
        let err = Schema::compile(&schema).expect_err(&schema.to_string());
        assert!(err.contains(want), "{schema}: {err}");
    }
    // Nesting deeper than the frames can hold, required all the way down.
    let mut deep = json!({"type": "string"});
    for _ in 0..MAX_FRAMES + 1 {
        deep = json!({"type": "array", "items": deep, "minItems": 1});
    }
    assert!(Schema::compile(&deep).unwrap_err().contains("deeper"));
    // A long chain of references ends in an error, not a stack overflow.
    let mut defs = serde_json::Map::new();
    for i in 0..4000 {
        defs.insert(format!("a{i}"), json!({"$ref": format!("#/$defs/a{}", i + 1)}));
    }
    defs.insert("a4000".into(), json!({"type": "string"}));
    let chain = json!({"$ref": "#/$defs/a0", "$defs": defs});
    assert!(Schema::compile(&chain).unwrap_err().contains("nest deeper"));
}

/// pydantic's `A | B` of models: objects told apart by their first
/// property's name, or by its const value under one name.
fn actions() -> Value {
    json!({
        "type": "object",
        "properties": {"action": {"anyOf": [
            {"$ref": "#/$defs/search"}, {"$ref": "#/$defs/answer"}, {"$ref": "#/$defs/stop"},
            {"type": "object", "properties": {"code": {"type": "integer"}}, "required": ["code"]},
            {"type": "null"}
        ]}},
        "required": ["action"],
        "$defs": {
            "search": {"type": "object", "properties": {"kind": {"const": "search", "type": "string"},
                "query": {"type": "string"}}, "required": ["kind", "query"]},
            "answer": {"type": "object", "properties": {"kind": {"enum": ["answer"]},
                "text": {"type": "string"}, "sure": {"type": "boolean"}}, "required": ["kind", "text"]},
            "stop": {"type": "object", "properties": {"kind": {"const": 10}}, "required": ["kind"]}
        }
    })
}

#[test]
fn unions_of_objects_told_apart_by_their_first_property() {
    let s = compile(actions());
    for doc in [
        r#"{"action":{"kind":"search","query":"cats"}}"#,
        r#"{"action":{ "kind" : "answer" , "text":"yes","sure":true}}"#,
        r#"{"action":{"kind":10}}"#,
        r#"{"action":{"code":-3}}"#,
        r#"{"action":null}"#,
    ] {
        assert!(accepts(&s, doc), "{doc}");
    }
    for (doc, at) in [
        (r#"{"action":{"kind":"search","text""#, 28), // search's second key is query
        (r#"{"action":{"kind":"other""#, 19),
        (r#"{"action":{"kind":100"#, 20),
        (r#"{"action":{}"#, 11),
    ] {
        assert_eq!(feed(&s, doc.as_bytes()).err(), Some(at), "{doc}");
    }
    for (schema, want) in [
        (
            json!({"anyOf": [{"type": "object", "properties": {"a": {}}, "required": ["a"]},
            {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"]}]}),
            "no property past those they share",
        ),
        (
            json!({"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "required": ["a", "b"]}]}),
            "\"a\" without a different const",
        ),
        (
            json!({"anyOf": [{"type": "object", "properties": {"a": {"const": 1}}},
            {"type": "object", "properties": {"b": {}}, "required": ["b"]}]}),
            "not required",
        ),
    ] {
        let err = Schema::compile(&schema).unwrap_err();
        assert!(err.contains("tells them apart") && err.contains(want), "{err}");
    }
    // oneOf: no value may fit two alternatives (names alone, or a shared value, could).
    let obj = |k: &str| json!({"type": "object", "properties": {k: {"type": "string"}}, "required": [k]});
    let one_of = [
        (json!({"oneOf": [obj("a"), obj("b")]}), "needs a const value"),
        (json!({"oneOf": [{"type": ["string", "null"]}, {"type": "null"}]}), "share a value"),
    ];
    for (schema, want) in one_of {
        let err = Schema::compile(&schema).unwrap_err();
        assert!(err.contains(want), "{schema}: {err}");
    }
    let many: Vec<Value> = (0..65).map(|i| obj(&format!("k{i}"))).collect();
    assert!(Schema::compile(&json!({"anyOf": many})).unwrap_err().contains("at most 64 objects"));
    // A union of a union of objects and another object flattens into one.
    let s =
        compile(json!({"anyOf": [{"$ref": "#/$defs/ab"}, obj("c")], "$defs": {"ab": {"anyOf": [obj("a"), obj("b")]}}}));
    assert!(accepts(&s, r#"{"b":"x"}"#) && accepts(&s, r#"{"c":"x"}"#));
    // Whitespace before a tag does not count against the run after it.
    let s = compile(actions());
    let spaced = format!("{{\"action\":{{\"kind\":{}\"search\" ,\"query\":\"q\"}}}}", " ".repeat(16));
    assert!(accepts(&s, &spaced), "{spaced}");
}

/// Objects that begin alike (required properties of one name and schema)
/// are told apart by the first property after those.
#[test]
fn unions_of_objects_that_begin_alike() {
    let obj = |props: Value, required: &[&str]| json!({"type": "object", "properties": props, "required": required});
    let cat = obj(
        json!({"name": {"type": "string"}, "age": {"type": "integer"}, "meows": {"type": "boolean"}}),
        &["name", "age", "meows"],
    );
    let dog = obj(
        json!({"name": {"type": "string"}, "age": {"type": "integer"}, "barks": {"type": "boolean"}}),
        &["name", "age", "barks"],
    );
    let s = compile(json!({"anyOf": [cat, dog]}));
    assert!(accepts(&s, r#"{"name":"Tom","age":3,"meows":true}"#));
    assert!(accepts(&s, r#"{ "name" : "Rex" , "age" : 5 , "barks" : false }"#));
    assert_eq!(feed(&s, br#"{"name":"Tom","age":3,"purrs""#).err(), Some(23));
    assert_eq!(feed(&s, br#"{"age""#).err(), Some(2));
    assert_eq!(feed(&s, br#"{"name":"Tom"}"#).err(), Some(13));
    // Alike by reference too; then a const tells them apart, and each goes on its own way.
    let s = compile(json!({"$defs": {"id": {"type": "string", "format": "uuid"}}, "oneOf": [
        obj(json!({"id": {"$ref": "#/$defs/id"}, "kind": {"const": "a"}, "x": {"type": "integer"}}), &["id", "kind", "x"]),
        obj(json!({"id": {"$ref": "#/$defs/id"}, "kind": {"const": "b"}, "y": {"type": "string"}}), &["id", "kind"]),
    ]}));
    let id = "123e4567-e89b-12d3-a456-426614174000";
    assert!(accepts(&s, &format!(r#"{{"id":"{id}","kind":"a","x":1}}"#)));
    assert!(accepts(&s, &format!(r#"{{"id":"{id}","kind":"b"}}"#)));
    assert!(feed(&s, format!(r#"{{"id":"{id}","kind":"a","y""#).as_bytes()).is_err());
    assert!(feed(&s, format!(r#"{{"id":"{id}","kind":"a"}}"#).as_bytes()).is_err());
}

#[test]
fn string_lengths_count_characters() {
    let s = compile(json!({"type": "string", "minLength": 2, "maxLength": 3}));
    for doc in [r#""ab""#, r#""abc""#, "\"é\\u00e9\"", r#""\ud83d\ude00x""#, r#""\n\t""#] {
        assert!(accepts(&s, doc), "{doc}");
    }
    assert_eq!(feed(&s, br#""a""#).err(), Some(2));
    assert_eq!(feed(&s, br#""abcd"#).err(), Some(4));
    assert_eq!(feed(&s, "\"ééé\\".as_bytes()).err(), Some(7));
    assert!(Schema::compile(&json!({"type": "string", "minLength": 3, "maxLength": 2})).is_err());
}

#[test]
fn patterns_and_formats_hold_on_the_decoded_content() {
    // Escapes are decoded for the pattern: `a"b\c` and a newline written as `\n`.
    let s = compile(json!({"type": "string", "pattern": "^a\"b\\\\c\n$"}));
    assert!(accepts(&s, r#""a\"b\\c\n""#));
    assert_eq!(feed(&s, br#""a\u"#).err(), Some(3), "no \\u escapes under a pattern");
    assert_eq!(feed(&s, br#""a\"b\\c\t"#).err(), Some(9));
    // A match anywhere, as validators search; lengths count characters.
    let s = compile(json!({"type": "string", "pattern": "[0-9]{2}", "maxLength": 4}));
    assert!(accepts(&s, r#""ab12""#) && accepts(&s, r#""é12""#) && !accepts(&s, r#""ab1""#));
    assert_eq!(feed(&s, br#""abc"#).err(), Some(3), "no room left for two digits");
    let s = compile(json!({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"},
        "id": {"type": ["integer", "null"], "format": "int32"}}, "required": ["when", "id"]}));
    assert!(accepts(&s, r#"{"when":"2024-02-29T23:59:59.5+01:00","id":-2147483648}"#));
    assert!(!accepts(&s, r#"{"when":"2024-02-29T23:59:59Z","id":2147483648}"#));
    assert_eq!(feed(&s, br#"{"when":"2024-13"#).err(), Some(15));
    // A pattern beside a format: both hold.
    let s = compile(json!({"type": "string", "format": "date", "pattern": "-12-"}));
    assert!(accepts(&s, r#""2024-12-31""#) && !accepts(&s, r#""2024-11-30""#));
    assert_eq!(feed(&s, br#""2024-11"#).err(), Some(7));
}

#[test]
fn integer_bounds_hold_digit_by_digit() {
    let s = compile(json!({"type": "integer", "minimum": 0, "maximum": 120}));
    for doc in ["0", "7", "99", "120"] {
        assert!(accepts(&s, doc), "{doc}");
    }
    // ("-0" is 0, so "-" may start one.)
    for (doc, at) in [("-1", 1), ("121", 2), ("1200", 3), ("05", 1)] {
        assert_eq!(feed(&s, doc.as_bytes()).err(), Some(at), "{doc}");
    }
    // "1" may still become "12": whole, but it may go on.
    let st = feed(&s, b"1").unwrap();
    assert!(st.complete(&s) && st.step(&s, b'2').is_some());
    let s = compile(json!({"type": "integer", "minimum": -5, "maximum": -2}));
    assert!(accepts(&s, "-2") && accepts(&s, "-5"));
    for (doc, at) in [("-1", 1), ("-6", 1), ("3", 0), ("-0", 1)] {
        assert_eq!(feed(&s, doc.as_bytes()).err(), Some(at), "{doc}");
    }
    let s = compile(
        json!({"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0}}, "required": ["n"]}),
    );
    assert_eq!(feed(&s, br#"{"n":0"#).err(), Some(5));
    assert!(accepts(&s, r#"{"n":1}"#));
    // Without bounds, any number of digits.
    assert!(accepts(&compile(json!({"type": "integer"})), "123456789012345678901234567890"));
    // Bounds at and past i64's ends, and beyond f64's exact integers, hold exactly.
    let s = compile(json!({"type": "integer", "maximum": 9223372036854775807u64}));
    assert!(accepts(&s, "9223372036854775807") && !accepts(&s, "9223372036854775808"));
    assert!(feed(&s, b"99999999999999999999").is_err());
    let s = compile(json!({"type": "integer", "maximum": 9007199254740995u64}));
    assert!(accepts(&s, "9007199254740995") && !accepts(&s, "9007199254740996"));
    let s = compile(json!({"type": "integer", "exclusiveMinimum": 100000000000000000u64}));
    assert!(!accepts(&s, "100000000000000000") && accepts(&s, "100000000000000001"));
    let s = compile(json!({"type": "integer", "exclusiveMinimum": 3.0, "maximum": 1e300}));
    assert!(!accepts(&s, "3") && accepts(&s, "4") && accepts(&s, "123456789012345678901234567890"));
    for (schema, want) in [
        (json!({"type": "number", "minimum": 1, "exclusiveMaximum": 1}), "no number"),
        (json!({"maximum": 3}), "without a `type`"),
        (json!({"type": "integer", "minimum": 3, "maximum": 2}), "no integer"),
        (json!({"minLength": 3}), "without a `type`"),
        (json!({"const": "a", "minLength": 3}), "beside"),
        (json!({"enum": [1, 5], "minimum": 3}), "beside"),
        (json!({"anyOf": [{"type": "string"}], "maxLength": 2}), "beside"),
    ] {
        let err = Schema::compile(&schema).unwrap_err();
        assert!(err.contains(want), "{schema}: {err}");
    }
}

#[test]
fn number_bounds_hold_as_decimals() {
    let s = compile(json!({"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1},
        "t": {"type": "number", "exclusiveMinimum": -273.15, "format": "float"}}, "required": ["p", "t"]}));
    for doc in [r#"{"p":0.5,"t":-273.14}"#, r#"{"p":1,"t":0}"#, r#"{"p":1.000,"t":1e400}"#, r#"{"p":-0,"t":5}"#] {
        // (An exponent is refused under bounds: 1e400 is written out.)
        assert_eq!(accepts(&s, doc), !doc.contains('e'), "{doc}");
    }
    for (doc, at) in [(r#"{"p":1.01"#, 8), (r#"{"p":2"#, 5), (r#"{"p":-0.1"#, 8), (r#"{"p":0.5e"#, 8)] {
        assert_eq!(feed(&s, doc.as_bytes()).err(), Some(at), "{doc}");
    }
    assert!(!accepts(&s, r#"{"p":0,"t":-273.15}"#) && accepts(&s, r#"{"p":0,"t":-273.149999}"#));
    assert_eq!(feed(&s, br#"{"p":0,"t":-273.16"#).err(), Some(17));
    // "0." may still end at 0.5; "0.9" in 0.25..0.5 may not go on.
    let s = compile(json!({"type": "number", "minimum": 0.25, "maximum": 0.5}));
    assert!(feed(&s, b"0.").is_ok() && feed(&s, b"0.9").is_err() && feed(&s, b"0.1").is_err());
    assert!(accepts(&s, "0.25") && accepts(&s, "0.5") && accepts(&s, "0.2500001") && !accepts(&s, "0.5000001"));
}

#[test]
fn choices_are_raw_text() {
    let s = Schema::choice(&["yes".into(), "no".into(), "not sure".into(), "nope".into()]).unwrap();
    for doc in ["yes", "no", "not sure", "nope"] {
        assert!(feed(&s, doc.as_bytes()).unwrap().complete(&s), "{doc}");
    }
    assert!(feed(&s, b"yes").unwrap().is_done(), "nothing may follow");
    assert!(feed(&s, b" yes").is_err() && feed(&s, b"\"yes\"").is_err() && feed(&s, b"yes ").is_err());
    assert!(feed(&s, b"no").unwrap().step(&s, b'p').is_some(), "\"no\" may go on to \"nope\"");
    assert!(Schema::choice(&[]).is_err() && Schema::choice(&["".into()]).is_err());
}

#[test]
fn what_the_review_found() {
    // Literals and keys past 255 bytes.
    let long = "y".repeat(300);
    let s = compile(
        json!({"type": "object", "properties": {long.clone(): {"enum": [long.clone()]}}, "required": [long.clone()]}),
    );
    assert!(accepts(&s, &format!("{{\"{long}\":\"{long}\"}}")));
    // An enum with a type keeps the values of that type; a top-level literal ends by itself.
    let s = compile(json!({"type": "string", "enum": ["a", 1]}));
    assert!(accepts(&s, "\"a\"") && feed(&s, b"1").is_err());
    let s = compile(json!({"type": "boolean"}));
    assert!(feed(&s, b"true").unwrap().is_done());
    // A self-referencing alternative leaves the others usable.
    let s =
        compile(json!({"anyOf": [{"type": "string"}, {"$ref": "#/$defs/l"}], "$defs": {"l": {"$ref": "#/$defs/l"}}}));
    assert!(accepts(&s, "\"x\""));
    // nullable beside a type list or an anyOf; items false; array keywords without a type.
    assert!(accepts(&compile(json!({"type": ["string", "null"], "nullable": true})), "null"));
    assert!(accepts(&compile(json!({"nullable": true})), "{}"));
    let s = compile(json!({"type": "array", "items": false}));
    assert!(accepts(&s, "[]") && feed(&s, b"[1").is_err());
    let s = compile(json!({"minItems": 2}));
    assert!(accepts(&s, "[1,{}]") && feed(&s, b"[1]").is_err());
    // At the frames' limit a free-keyed object takes no key whose value needs a container.
    let s = compile(json!({"type": "object", "additionalProperties": {"$ref": "#"}}));
    let deep = "{\"a\":".repeat(MAX_FRAMES - 1) + "{";
    let st = feed(&s, deep.as_bytes()).unwrap();
    assert!(st.step(&s, b'"').is_none() && st.step(&s, b'}').is_some());
    // References to string enums merge into one set of literals.
    let s = compile(json!({"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
        "$defs": {"a": {"enum": ["x", "y"]}, "b": {"enum": ["z"]}}}));
    assert!(accepts(&s, "\"y\"") && accepts(&s, "\"z\""));
}

/// A small validator, written apart from the grammar: whether `v` is an
/// instance of `schema` (the compiler's subset; keys in the listed order).
fn valid(doc: &Value, schema: &Value, v: &Value) -> bool {
    let schema = match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.pointer(&r[1..]).unwrap(),
        None => schema,
    };
    if let Some(e) = schema.get("enum") {
        return e.as_array().unwrap().contains(v);
    }
    if let Some(c) = schema.get("const") {
        return c == v;
    }
    if let Some(alts) = schema.get("anyOf") {
        return alts.as_array().unwrap().iter().any(|a| valid(doc, a, v));
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t],
        Some(Value::Array(ts)) => ts.iter().map(|t| t.as_str().unwrap()).collect(),
        _ => return true,
    };
    types.iter().any(|t| match (*t, v) {
        ("string", Value::String(t)) => {
            let n = t.chars().count() as u64;
            let bound = |k: &str| schema.get(k).and_then(Value::as_u64);
            let format = schema.get("format").and_then(Value::as_str).and_then(super::format_pattern);
            let pattern = schema.get("pattern").and_then(Value::as_str).map(str::to_string);
            let mut patterns = pattern.into_iter().chain(format.into_iter().flatten());
            n >= bound("minLength").unwrap_or(0)
                && n <= bound("maxLength").unwrap_or(u64::MAX)
                && patterns.all(|p| regex::Regex::new(&p).unwrap().is_match(t))
        }
        ("null", Value::Null) | ("boolean", Value::Bool(_)) => true,
        ("number" | "integer", Value::Number(n)) => {
            let bound = |k: &str| schema.get(k).and_then(Value::as_f64);
            n.as_f64().is_some_and(|f| {
                (*t == "number" || f.fract() == 0.0)
                    && bound("minimum").is_none_or(|m| f >= m)
                    && bound("maximum").is_none_or(|m| f <= m)
                    && bound("exclusiveMinimum").is_none_or(|m| f > m)
                    && bound("exclusiveMaximum").is_none_or(|m| f < m)
                    && bound("multipleOf").is_none_or(|k| (f / k).fract() == 0.0)
            })
        }
        ("array", Value::Array(items)) => {
            let count = |k: &str| schema.get(k).and_then(Value::as_u64);
            items.len() as u64 >= count("minItems").unwrap_or(0)
                && items.len() as u64 <= count("maxItems").unwrap_or(u64::MAX)
                && items.iter().all(|i| schema.get("items").is_none_or(|s| valid(doc, s, i)))
        }
        ("object", Value::Object(m)) => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                return m.values().all(|x| schema.get("additionalProperties").is_none_or(|s| valid(doc, s, x)));
            };
            let names: Vec<&String> = props.keys().collect();
            let order: Vec<usize> =
                m.keys().map(|k| names.iter().position(|n| *n == k).unwrap_or(usize::MAX)).collect();
            let required = schema.get("required").and_then(Value::as_array).cloned().unwrap_or_default();
            order.windows(2).all(|w| w[0] < w[1])
                && order.iter().all(|&i| i != usize::MAX)
                && required.iter().all(|r| m.contains_key(r.as_str().unwrap()))
                && m.iter().all(|(k, x)| valid(doc, &props[k], x))
        }
        _ => false,
    })
}

/// Random walks through the grammar: at every step some byte is accepted
/// (no dead ends), and each walk that ends is a valid instance.
#[test]
fn random_walks_never_dead_end_and_end_valid() {
    let schemas = [
        person(),
        json!({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
            "value": {"type": "number"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}
        }, "required": ["value"]}}}),
        actions(),
        json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 1, "maxLength": 3},
            "n": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": -3, "exclusiveMaximum": 250}},
            "p": {"type": "number", "minimum": 0.25, "maximum": 1}, "t": {"type": "number", "exclusiveMinimum": -273.15},
            "x": {"type": "number", "minimum": -7.5, "exclusiveMaximum": -0.001}},
            "required": ["s", "n", "p", "t", "x"]}),
        json!({"type": "object", "properties": {"q": {"type": "integer", "multipleOf": 5, "minimum": -20, "maximum": 1000},
            "r": {"type": "number", "multipleOf": 0.25}, "m": {"type": "integer", "multipleOf": 3},
            "h": {"type": "number", "multipleOf": 0.5, "exclusiveMinimum": 0, "maximum": 2}},
            "required": ["q", "r", "m", "h"]}),
        // Free-keyed objects of themselves: their keys stop where the frames run out.
        json!({"type": "object", "additionalProperties": {"$ref": "#"}}),
        // (Patterns whose meaning is the same in the `regex` crate's syntax.)
        json!({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "when": {"type": "string", "format": "date"},
            "mail": {"type": "string", "format": "email", "pattern": "^[a-c.]+@"},
            "tag": {"type": "string", "pattern": "ab|c\n|é", "minLength": 2, "maxLength": 6}},
            "required": ["code", "when", "mail", "tag"]}),
        json!({"type": "array", "maxItems": 3, "items": {"anyOf": [
            {"type": "object", "properties": {"n": {"type": "string", "maxLength": 4}, "a": {"type": "integer"},
                "k": {"const": "x"}, "b": {"type": "boolean"}}, "required": ["n", "a", "k"]},
            {"type": "object", "properties": {"n": {"type": "string", "maxLength": 4}, "a": {"type": "integer"},
                "k": {"const": "y"}}, "required": ["n", "a", "k"]},
            {"type": "object", "properties": {"n": {"type": "string", "maxLength": 4}, "a": {"type": "integer"},
                "z": {"type": "null"}}, "required": ["n", "a", "z"]}
        ]}}),
        json!({"type": "array", "minItems": 1, "maxItems": 4, "items": {"anyOf": [
            {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
            {"enum": ["a", "ab", true, 10, 1]},
            {"type": "array", "items": {"type": "string"}}
        ]}}),
    ];
    let mut next = picker(0x9e37_79b9_7f4a_7c15);
    // Bytes a model might write; the grammar picks which it allows.
    let alphabet: Vec<u8> = (b' '..=b'~').chain([b'\n', 0xc3, 0xa9]).collect();
    for doc in &schemas {
        let s = compile(doc.clone());
        let mut ended = 0;
        for _ in 0..300 {
            let mut st = SchemaState::start(&s);
            let mut out = Vec::new();
            for _ in 0..400 {
                if st.complete(&s) && (st.is_done() || next(4) == 0) {
                    break;
                }
                let choices: Vec<(u8, SchemaState)> =
                    alphabet.iter().filter_map(|&b| st.step(&s, b).map(|n| (b, n))).collect();
                let out_text = String::from_utf8_lossy(&out).into_owned();
                assert!(!choices.is_empty(), "{doc}: dead end after {out_text:?}");
                // Prefer closing bytes now and then, so that walks end.
                let closing: Vec<&(u8, SchemaState)> = choices.iter().filter(|(b, _)| b"}]\"".contains(b)).collect();
                let (b, n) = if !closing.is_empty() && next(3) == 0 {
                    *closing[next(closing.len())]
                } else {
                    choices[next(choices.len())]
                };
                out.push(b);
                st = n;
            }
            if st.complete(&s) {
                ended += 1;
                let v: Value = match serde_json::from_slice(&out) {
                    Ok(v) => v,
                    // JSON's grammar has no range; serde_json's f64 has (6E332).
                    Err(e) if e.to_string().contains("out of range") => continue,
                    Err(e) => panic!("{e}: {:?}", String::from_utf8_lossy(&out)),
                };
                assert!(valid(doc, doc, &v), "{doc}: {v}");
            }
        }
        assert!(ended > 100, "{doc}: only {ended} walks ended");
    }
}

/// The mask, walked through the vocabulary trie (whole subtrees of string
/// content accepted at once where a string has room), allows exactly the
/// tokens that stepping their bytes one by one allows.
#[test]
fn mask_matches_stepping_each_token() {
    use super::super::format::{Constraint, OutputFormat};
    use super::super::json::JsonVocab;
    use std::sync::Arc;
    let mut next = picker(0x2545_f491_4f6c_dd1d);
    // Short and long tokens of string content, structure, digits, escapes, UTF-8.
    let soup: Vec<u8> =
        b"abcxyz \"\\n{}[]:,-0123456789u".iter().copied().chain([0xc3, 0xa9, 0xe2, 0x82, 0xac]).collect();
    let mut bytes: Vec<Vec<u8>> =
        (0..1500).map(|_| (0..1 + next(9)).map(|_| soup[next(soup.len())]).collect()).collect();
    bytes.extend([
        b"\"s\"".to_vec(),
        b"\"n\"".to_vec(),
        b"\"k\"".to_vec(),
        b"\"p\"".to_vec(),
        b"abcdefghijkl".to_vec(),
    ]);
    // Every printable byte alone too, so that any output can be spelled.
    bytes.extend((b' '..=b'~').map(|b| vec![b]));
    let eos = bytes.len() as u32;
    bytes.push(Vec::new());
    let vocab = Arc::new(JsonVocab::new(bytes, &[eos]));
    let n = vocab.token_bytes.len();
    let schema = Arc::new(compile(json!({"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 20},
        "n": {"type": "integer", "minimum": -40, "maximum": 900},
        "k": {"type": "string", "minLength": 2},
        "p": {"type": "string", "pattern": "^(ab|\\n|é)+$", "maxLength": 9}
    }, "required": ["s", "n", "k", "p"]})));
    let mut states = 0;
    for _ in 0..40 {
        let mut c = Constraint::new(vocab.clone(), &OutputFormat::Schema(schema.clone()));
        let mut out = Vec::new();
        for _ in 0..80 {
            let mut logits = vec![1.0f32; n];
            c.mask(&mut logits);
            states += 1;
            for (id, &l) in logits.iter().enumerate() {
                let ok = c.clone().advance(id as u32);
                assert_eq!(l == 1.0, ok, "token {id} {:?}", String::from_utf8_lossy(&vocab.token_bytes[id]));
            }
            if c.is_complete() {
                break;
            }
            let allowed: Vec<usize> = (0..n).filter(|&i| logits[i] == 1.0).collect();
            assert!(!allowed.is_empty(), "a dead end after {:?}", String::from_utf8_lossy(&out));
            let pick = allowed[next(allowed.len())];
            out.extend(&vocab.token_bytes[pick]);
            assert!(c.advance(pick as u32));
        }
    }
    assert!(states > 500);
}
