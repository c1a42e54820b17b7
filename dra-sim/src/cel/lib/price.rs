//! The runtime prices the libraries share: cel-go's sizes, the string traversal factor, the
//! regex match price and ext.Lists' allocation price.
use crate::cel::value::Value;

/// cel-go's `actualSize`: the size of strings (in code points), bytes, lists and maps, an
/// optional's value's, 1 for anything else.
pub(crate) fn size(v: &Value) -> u64 {
    match v {
        Value::Str(s) => s.chars().count() as u64,
        Value::Bytes(x) => x.len() as u64,
        Value::List(l) => l.len() as u64,
        Value::Map(m) => m.entries.len() as u64,
        Value::Optional(Some(x)) => size(x),
        _ => 1,
    }
}

/// The Kubernetes estimator's size, which does not look into optionals.
pub(crate) fn k8s_size(v: &Value) -> u64 {
    match v {
        Value::Optional(_) => 1,
        v => size(v),
    }
}

/// `ceil(n * per / 10)`: the string traversal factor (0.1) times `per`.
pub(super) fn tenths(n: u64, per: u64) -> u64 {
    (n * per).div_ceil(10)
}

/// The Kubernetes estimator's `traversalCost` (a tenth of each string's bytes, rounded down).
pub(super) fn traversal(v: &Value) -> u64 {
    match v {
        Value::Str(s) => s.len() as u64 / 10,
        Value::Bytes(x) => x.len() as u64 / 10,
        Value::List(l) => l.iter().map(traversal).sum(),
        Value::Map(m) => m
            .entries
            .iter()
            .map(|(k, v)| traversal(k) + traversal(v))
            .sum(),
        _ => 1,
    }
}

/// The price of matching a string of `chars` code points against a regex of `regex` (cel-go's
/// `matches`, and the Kubernetes estimator's for `find`, `findAll` and the named formats'
/// `validate`): a tenth of the string plus one, times a quarter of the regex, each rounded up.
pub(super) fn match_cost(chars: u64, regex: u64) -> u64 {
    tenths(chars + 1, 1) * regex.div_ceil(4)
}

/// An ext.Lists allocating call: 1 for the call, 10 for the list, `factor` per unit of `n`.
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "factor is never negative: the integer part, as Go's uint64(float64) takes it"
)]
pub(super) fn list_alloc(factor: f64, n: u64) -> u64 {
    11 + (n as f64 * factor) as u64
}
