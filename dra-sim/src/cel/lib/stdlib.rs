//! cel-go's standard library: the operators (arithmetic, equality, ordering, `in`, indexing),
//! `size`, `contains`/`startsWith`/`endsWith`, field selection, and the map building the
//! two-variable comprehension macros use. Conversions are in `conversions`.
use super::overload::{Resolved, Sig};
use super::price::{size, tenths};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{
    EvalResult, MapVal, Value, b, double_to_int_lossless, double_to_uint_lossless, equals,
    hashable, int_len, no_overload, num_cmp,
};
use std::cmp::Ordering;
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "_+_",
    "_-_",
    "_*_",
    "_/_",
    "_%_",
    "-_",
    "!_",
    "_==_",
    "_!=_",
    "_<_",
    "_<=_",
    "_>_",
    "_>=_",
    "@in",
    "_[_]",
    "_[?_]",
    "size",
    "contains",
    "startsWith",
    "endsWith",
];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    arithmetic(s).or_else(|| relations(s))
}

/// The result type of the overloads whose parameters accept the arguments (as cel-go's
/// checker: each argument on its own, `dyn` fitting anything): the first one's, or `dyn` when
/// several with different results match.
fn overloads(t: &[Ty], sigs: &[(&[Ty], Ty)]) -> Option<Ty> {
    let mut out: Option<Ty> = None;
    for (params, result) in sigs {
        if params.iter().zip(t).all(|(p, a)| p.accepts(a)) {
            out = Some(match out {
                Some(prev) if prev != *result => Ty::Dyn,
                _ => result.clone(),
            });
        }
    }
    out
}

/// Whether the timestamp and duration overloads of `+`, `-` and the orderings (which this
/// environment has no values of) would match: `null` stands for them, `dyn` for anything.
fn time_like(t: &[Ty]) -> bool {
    t.iter().all(|x| x.is_dyn() || *x == Ty::Null) && t.contains(&Ty::Null)
}

/// `list(A) + list(A)`: the joined list type, if both sides may be lists.
fn list_concat(t: &[Ty]) -> Option<Ty> {
    match (&t[0], &t[1]) {
        (Ty::List(a), Ty::List(b)) => a.bind(b).map(Ty::list),
        (Ty::List(a), d) | (d, Ty::List(a)) if d.is_dyn() => Some(Ty::list((**a).clone())),
        (a, b) if a.is_dyn() && b.is_dyn() => Some(Ty::Dyn),
        _ => None,
    }
}

/// `+`, `-`, `*`, `/`, `%`, negation and `!`.
fn arithmetic(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    let num: &[(&[Ty], Ty)] = &[
        (&[Int, Int], Int),
        (&[Uint, Uint], Uint),
        (&[Double, Double], Double),
    ];
    let found = |r: Option<Ty>, f: Func| Some(r.map(|ty| (f, ty)).ok_or(None));
    match (name, s.member, n) {
        ("_+_", false, 2) => {
            let text: &[(&[Ty], Ty)] = &[(&[Str, Str], Str), (&[Bytes, Bytes], Bytes)];
            let time = time_like(t).then_some(Dyn);
            let r = [overloads(t, num), overloads(t, text), list_concat(t), time]
                .into_iter()
                .flatten()
                .reduce(|a, b| if a == b { a } else { Dyn });
            found(r, F::Add)
        }
        ("_-_" | "_*_" | "_/_", false, 2) => {
            let f = match name {
                "_-_" => F::Sub,
                "_*_" => F::Mul,
                _ => F::Div,
            };
            let time = (f == F::Sub && time_like(t)).then_some(Dyn);
            found(overloads(t, num).or(time), f)
        }
        ("_%_", false, 2) => found(overloads(t, &num[..2]), F::Mod),
        ("-_", false, 1) => found(overloads(t, &[(&[Int], Int), (&[Double], Double)]), F::Neg),
        ("!_", false, 1) => found(overloads(t, &[(&[Bool], Bool)]), F::Not),
        _ => None,
    }
}

/// Whether `<`, `<=`, `>`, `>=` have an overload: numbers of any two types (cel-go's
/// cross-type numeric comparisons), or two strings, bytes or bools.
fn ordered(t: &[Ty]) -> bool {
    let num = |x: &Ty| x.is_num() || x.is_dyn();
    (num(&t[0]) && num(&t[1]))
        || time_like(t)
        || [Ty::Str, Ty::Bytes, Ty::Bool]
            .iter()
            .any(|k| k.accepts(&t[0]) && k.accepts(&t[1]))
}

/// Equality, ordering, `in`, indexing, `size` and the string tests.
fn relations(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    Some(match (name, s.member, n) {
        ("@not_strictly_false", false, 1) => ok!(F::NotStrictlyFalse, Bool),
        ("_==_" | "_!=_", false, 2) => {
            if t[0].unify(&t[1]).is_some() {
                ok!(if name == "_==_" { F::Eq } else { F::Ne }, Bool)
            }
            Err(None)
        }
        ("_<_" | "_<=_" | "_>_" | "_>=_", false, 2) => {
            if ordered(t) {
                let f = match name {
                    "_<_" => F::Lt,
                    "_<=_" => F::Le,
                    "_>_" => F::Gt,
                    _ => F::Ge,
                };
                ok!(f, Bool)
            }
            Err(None)
        }
        ("@in", false, 2) => match &t[1] {
            List(e) if e.unify(&t[0]).is_some() => ok!(F::In, Bool),
            Map(k, _) if k.unify(&t[0]).is_some() => ok!(F::In, Bool),
            x if x.is_dyn() => ok!(F::In, Bool),
            _ => Err(None),
        },
        // an index into an optional list or map is an optional one (the optional library)
        ("_[_]" | "_[?_]", false, 2) => {
            let (holder, opt) = match &t[0] {
                Opt(inner) => (&**inner, true),
                x => (x, name == "_[?_]"),
            };
            let elem = match holder {
                List(e) if Int.accepts(&t[1]) => (**e).clone(),
                Map(k, v) if k.unify(&t[1]).is_some() => (**v).clone(),
                x if x.is_dyn() => Dyn,
                _ => return Some(Err(None)),
            };
            if opt {
                ok!(F::OptIndex, Ty::opt(elem))
            }
            ok!(F::Index, elem)
        }
        ("size", _, 1) => {
            if matches!(t[0], Str | Bytes | List(_) | Map(_, _)) || s.d(0) {
                ok!(F::Size, Int)
            }
            Err(None)
        }
        ("contains" | "startsWith" | "endsWith", true, 2) => {
            if s.is(0, &Str) && s.is(1, &Str) {
                let f = match name {
                    "contains" => F::Contains,
                    "startsWith" => F::StartsWith,
                    _ => F::EndsWith,
                };
                ok!(f, Bool)
            }
            Err(None)
        }
        _ => return None,
    })
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::Add => add(a),
        Func::Sub => sub(a),
        Func::Mul => mul(a),
        Func::Div => match (&a[0], &a[1]) {
            (Int(_), Int(0)) | (Uint(_), Uint(0)) => Err("division by zero".into()),
            (Int(x), Int(y)) => x
                .checked_div(*y)
                .map(Int)
                .ok_or_else(|| "integer overflow".into()),
            (Uint(x), Uint(y)) => Ok(Uint(x / y)),
            (Double(x), Double(y)) => Ok(Double(x / y)),
            _ => no_overload(),
        },
        Func::Mod => match (&a[0], &a[1]) {
            (Int(_), Int(0)) | (Uint(_), Uint(0)) => Err("modulus by zero".into()),
            (Int(x), Int(y)) => x
                .checked_rem(*y)
                .map(Int)
                .ok_or_else(|| "integer overflow".into()),
            (Uint(x), Uint(y)) => Ok(Uint(x % y)),
            _ => no_overload(),
        },
        Func::Neg => match &a[0] {
            Int(x) => x
                .checked_neg()
                .map(Int)
                .ok_or_else(|| "integer overflow".into()),
            Double(x) => Ok(Double(-x)),
            _ => no_overload(),
        },
        Func::Not => match &a[0] {
            Bool(x) => b(!x),
            _ => no_overload(),
        },
        Func::Eq => b(equals(&a[0], &a[1])?),
        // cel-go's `!=` is "equality did not answer true": an error from a Kubernetes type's
        // equality (a different type behind `dyn`) makes it true, where `==` fails
        Func::Ne => b(!matches!(equals(&a[0], &a[1]), Ok(true))),
        Func::Lt | Func::Le | Func::Gt | Func::Ge => {
            let o = compare(&a[0], &a[1])?;
            b(match f {
                Func::Lt => o == Some(Ordering::Less),
                Func::Le => matches!(o, Some(Ordering::Less | Ordering::Equal)),
                Func::Gt => o == Some(Ordering::Greater),
                _ => matches!(o, Some(Ordering::Greater | Ordering::Equal)),
            })
        }
        Func::In => contained(a),
        Func::Index => index(&a[0], &a[1]),
        Func::OptIndex => match &a[0] {
            Optional(None) => Ok(Optional(None)),
            Optional(Some(inner)) => opt_index(inner, &a[1]),
            v => opt_index(v, &a[1]),
        },
        Func::NotStrictlyFalse => unreachable_ok(),
        Func::Size => match &a[0] {
            Str(s) => Ok(Int(int_len(s.chars().count()))),
            Bytes(x) => Ok(Int(int_len(x.len()))),
            List(l) => Ok(Int(int_len(l.len()))),
            Map(m) => Ok(Int(int_len(m.entries.len()))),
            _ => no_overload(),
        },
        Func::Contains | Func::StartsWith | Func::EndsWith => match (&a[0], &a[1]) {
            (Str(x), Str(y)) => b(match f {
                Func::Contains => x.contains(y.as_ref()),
                Func::StartsWith => x.starts_with(y.as_ref()),
                _ => x.ends_with(y.as_ref()),
            }),
            _ => no_overload(),
        },
        Func::MapInsert | Func::MapMerge => map_insert(f, a),
        _ => no_overload(),
    }
}

/// `Add`.
fn add(a: &[Value]) -> EvalResult {
    use Value::*;
    match (&a[0], &a[1]) {
        (Int(x), Int(y)) => x
            .checked_add(*y)
            .map(Int)
            .ok_or_else(|| "integer overflow".into()),
        (Uint(x), Uint(y)) => x
            .checked_add(*y)
            .map(Uint)
            .ok_or_else(|| "unsigned integer overflow".into()),
        (Double(x), Double(y)) => Ok(Double(x + y)),
        (Str(x), Str(y)) => Ok(Value::str(&format!("{x}{y}"))),
        (Bytes(x), Bytes(y)) => Ok(Bytes(Arc::from([x.as_ref(), y.as_ref()].concat()))),
        (List(x), List(y)) => {
            let mut v = (**x).clone();
            v.extend(y.iter().cloned());
            Ok(List(Arc::new(v)))
        }
        _ => no_overload(),
    }
}

/// `Sub`.
fn sub(a: &[Value]) -> EvalResult {
    use Value::*;
    match (&a[0], &a[1]) {
        (Int(x), Int(y)) => x
            .checked_sub(*y)
            .map(Int)
            .ok_or_else(|| "integer overflow".into()),
        (Uint(x), Uint(y)) => x
            .checked_sub(*y)
            .map(Uint)
            .ok_or_else(|| "unsigned integer overflow".into()),
        (Double(x), Double(y)) => Ok(Double(x - y)),
        _ => no_overload(),
    }
}

/// `Mul`.
fn mul(a: &[Value]) -> EvalResult {
    use Value::*;
    match (&a[0], &a[1]) {
        (Int(x), Int(y)) => x
            .checked_mul(*y)
            .map(Int)
            .ok_or_else(|| "integer overflow".into()),
        (Uint(x), Uint(y)) => x
            .checked_mul(*y)
            .map(Uint)
            .ok_or_else(|| "unsigned integer overflow".into()),
        (Double(x), Double(y)) => Ok(Double(x * y)),
        _ => no_overload(),
    }
}

/// `In`: on a list, whether the value equals a member (asked of the value, as cel-go does:
/// a quantity is not equal to anything else); on a map, whether it finds the key.
fn contained(a: &[Value]) -> EvalResult {
    use Value::*;
    match &a[1] {
        List(l) => b(l.iter().any(|x| matches!(equals(&a[0], x), Ok(true)))),
        Map(m) => b(m.find(&a[0])?.is_some()),
        _ => no_overload(),
    }
}

/// `x in [constants]`, which cel-go plans as a lookup in a Go map of the members, each number
/// also under its lossless twins of the other numeric types (see `plan`): `x` found as it is.
pub(crate) fn in_set(set: &[Value], x: &Value) -> EvalResult {
    use Value::*;
    hashable(x)?;
    let twins = |m: &Value| -> [Option<Value>; 3] {
        match m {
            Int(i) => [
                Some(m.clone()),
                Some(Double(*i as f64)),
                u64::try_from(*i).ok().map(Uint),
            ],
            Uint(u) => [
                Some(m.clone()),
                Some(Double(*u as f64)),
                i64::try_from(*u).ok().map(Int),
            ],
            Double(d) => [
                Some(m.clone()),
                double_to_int_lossless(*d).map(Int),
                double_to_uint_lossless(*d).map(Uint),
            ],
            _ => [Some(m.clone()), None, None],
        }
    };
    let same = |k: &Value| match (k, x) {
        (Int(p), Int(q)) => p == q,
        (Uint(p), Uint(q)) => p == q,
        (Double(p), Double(q)) => p == q,
        (Str(p), Str(q)) => p == q,
        (Bool(p), Bool(q)) => p == q,
        _ => false,
    };
    b(set.iter().any(|m| twins(m).iter().flatten().any(same)))
}

/// `MapInsert`, `MapMerge`.
fn map_insert(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    let Map(m) = &a[0] else { return no_overload() };
    let add: Vec<(Value, Value)> = if f == Func::MapInsert {
        vec![(a[1].clone(), a[2].clone())]
    } else {
        let Map(n) = &a[1] else { return no_overload() };
        n.entries.clone()
    };
    let mut out = MapVal {
        entries: m.entries.clone(),
        ..MapVal::default()
    };
    for (k, v) in add {
        check_key(&k)?;
        if map_lookup(&out, &k)?.is_some() {
            return Err(format!("insert failed: key {} already exists", display(&k)));
        }
        out.entries.push((k, v));
    }
    Ok(Map(Arc::new(out)))
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    use Value::*;
    let sz = |i: usize| a.get(i).map(size).unwrap_or(1);
    match f {
        Func::Eq | Func::Ne => match &a[0] {
            Quantity(_) | Ip(_) | Cidr(_) | Url(_) | Semver(_) | Format(_) => 1,
            _ => tenths(sz(0).min(sz(1)), 1),
        },
        Func::Lt | Func::Le | Func::Gt | Func::Ge => match (&a[0], &a[1]) {
            (Str(_), Str(_)) | (Bytes(_), Bytes(_)) => tenths(sz(0).min(sz(1)), 1),
            _ => 1,
        },
        Func::Add => match (&a[0], &a[1]) {
            (Str(_), Str(_)) | (Bytes(_), Bytes(_)) => tenths(sz(0) + sz(1), 1),
            _ => 1,
        },
        Func::StartsWith | Func::EndsWith => tenths(sz(1), 1),
        Func::Contains => tenths(sz(0), 1) * tenths(sz(1), 1),
        Func::In => match &a[1] {
            List(_) => sz(1),
            _ => 1,
        },
        _ => 1,
    }
}

fn unreachable_ok() -> EvalResult {
    Ok(Value::Bool(true))
}

pub(crate) fn display(v: &Value) -> String {
    match v {
        Value::Str(s) => s.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Uint(u) => u.to_string(),
        Value::Bool(x) => x.to_string(),
        _ => v.type_name().to_string(),
    }
}

pub(super) fn compare(x: &Value, y: &Value) -> Result<Option<Ordering>, String> {
    use Value::*;
    if let Some(o) = num_cmp(x, y) {
        return Ok(Some(o));
    }
    Ok(Some(match (x, y) {
        (Str(p), Str(q)) => p.cmp(q),
        (Bytes(p), Bytes(q)) => p.cmp(q),
        (Bool(p), Bool(q)) => p.cmp(q),
        // cel-go's `Compare` refuses NaN on either side, for every numeric type
        (Int(_) | Uint(_) | Double(_), Int(_) | Uint(_) | Double(_)) => {
            return Err("NaN values cannot be ordered".into());
        }
        _ => return no_overload(),
    }))
}

pub(super) fn check_key(k: &Value) -> Result<(), String> {
    match k {
        Value::Str(_) | Value::Int(_) | Value::Uint(_) | Value::Bool(_) => Ok(()),
        Value::Double(_) => Ok(()),
        _ => Err(format!("unsupported key type: {}", k.type_name())),
    }
}

/// A map lookup: the value, or for the device's attribute and capacity maps an empty domain.
pub(super) fn map_lookup(m: &MapVal, key: &Value) -> Result<Option<Value>, String> {
    if let Some(v) = m.find(key)? {
        return Ok(Some(v.clone()));
    }
    Ok(m.default_empty.then(Value::empty_map))
}

pub(crate) fn select(v: &Value, field: &Value, test: bool) -> EvalResult {
    let Value::Str(f) = field else {
        return no_overload();
    };
    match v {
        Value::Device(d) => {
            if test {
                return Ok(Value::Bool(true));
            }
            match f.as_ref() {
                "driver" => Ok(d.driver.clone()),
                "attributes" => Ok(d.attributes.clone()),
                "capacity" => Ok(d.capacity.clone()),
                "allowMultipleAllocations" => Ok(Value::Bool(d.allow_multiple_allocations)),
                _ => Err(format!("no such key: {f}")),
            }
        }
        Value::Map(m) => {
            if test {
                return Ok(Value::Bool(m.get_str(f).is_some() || m.default_empty));
            }
            match m.get_str(f) {
                Some(x) => Ok(x.clone()),
                None if m.default_empty => Ok(Value::empty_map()),
                None => Err(format!("no such key: {f}")),
            }
        }
        // cel-go qualifies the value an optional holds, optionally from there on
        Value::Optional(None) if !test => Ok(Value::Optional(None)),
        Value::Optional(Some(inner)) if !test => opt_select(inner, field),
        Value::Optional(Some(inner)) => select(inner, field, true),
        // a list takes only numeric qualifiers, even to test presence
        Value::List(_) => list_index(field).map(|_| Value::Null),
        // cel-go answers presence tests (`has`, `.?`) on other types with "absent"
        _ if test => Ok(Value::Bool(false)),
        _ => Err(format!(
            "type '{}' does not support field selection",
            v.type_name()
        )),
    }
}

pub(crate) fn opt_select(v: &Value, field: &Value) -> EvalResult {
    match select(v, field, true)? {
        Value::Bool(true) => Ok(Value::Optional(Some(Arc::new(select(v, field, false)?)))),
        _ => Ok(Value::Optional(None)),
    }
}

pub(crate) fn index(c: &Value, k: &Value) -> EvalResult {
    match c {
        Value::List(l) => {
            let i = list_index(k)?;
            match usize::try_from(i).ok().and_then(|u| l.get(u)) {
                Some(v) => Ok(v.clone()),
                None => Err(format!("index out of bounds: {i}")),
            }
        }
        Value::Map(m) => {
            check_key(k)?;
            map_lookup(m, k)?.ok_or_else(|| format!("no such key: {}", display(k)))
        }
        Value::Device(_) => match k {
            Value::Str(_) => select(c, k, false),
            _ => no_overload(),
        },
        _ => no_overload(),
    }
}

/// `c[?k]`: cel-go's presence-testing qualification. A value that is neither list nor map
/// holds nothing (no error), a list index must still be a valid one.
fn opt_index(c: &Value, k: &Value) -> EvalResult {
    match c {
        Value::List(l) => {
            let i = list_index(k)?;
            Ok(Value::Optional(
                usize::try_from(i)
                    .ok()
                    .and_then(|i| l.get(i))
                    .map(|v| Arc::new(v.clone())),
            ))
        }
        Value::Map(m) => Ok(Value::Optional(map_lookup(m, k)?.map(Arc::new))),
        _ => Ok(Value::Optional(None)),
    }
}

/// cel-go's `IndexOrError`: a list index of type int, or a uint or double that is exactly one.
fn list_index(k: &Value) -> Result<i64, String> {
    let i = match k {
        Value::Int(i) => Some(*i),
        Value::Uint(u) => i64::try_from(*u).ok(),
        Value::Double(d) => double_to_int_lossless(*d),
        _ => {
            return Err(format!(
                "unsupported index type '{}' in list",
                k.type_name()
            ));
        }
    };
    i.ok_or_else(|| format!("unsupported index value {}", display(k)))
}
