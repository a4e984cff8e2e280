//! Reading TOML values as the flags' text, shared by the config file's
//! settings and its `[[route]]` tables.

use toml_edit::{Item, Value};

/// A setting's value(s) as text: one scalar, or an array of them; `None`
/// for a table, which each caller words in its own error.
pub(crate) fn values(item: &Item) -> Option<Result<Vec<String>, String>> {
    match item {
        Item::Value(Value::Array(a)) => Some(a.iter().map(scalar).collect()),
        Item::Value(v) => Some(scalar(v).map(|s| vec![s])),
        _ => None,
    }
}

pub(crate) fn scalar(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.value().clone()),
        Value::Integer(i) => Ok(i.value().to_string()),
        Value::Float(f) => Ok(f.value().to_string()),
        Value::Boolean(b) => Ok(b.value().to_string()),
        _ => Err("expected a string, number or boolean".to_string()),
    }
}

/// The 1-based line of a byte offset, for error messages.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
