//! ext.Strings v2 and `strings.quote`: `charAt`, `indexOf`, `lastIndexOf`, `lowerAscii`,
//! `upperAscii`, `trim`, `replace`, `split`, `substring`, `join` (`reverse` of strings is v3,
//! which Kubernetes does not declare; the list functions are ext.Lists', in `lists`); `format`
//! has its own module.
use super::overload::{Resolved, Sig};
use super::price::{k8s_size, size, tenths, traversal};
use crate::cel::func::Func;
use crate::cel::quote::go_escape;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, Value, int_len, no_overload};
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "split",
    "substring",
    "join",
    "strings.quote",
];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    Some(match (name, s.member, n) {
        ("charAt", true, 2) if s.is(0, &Str) && s.is(1, &Int) => ok!(F::CharAt, Str),
        ("indexOf" | "lastIndexOf", true, 2 | 3) if t[0] == Str || (s.d(0) && s.is(1, &Str)) => {
            if s.is(1, &Str) && (n == 2 || s.is(2, &Int)) {
                ok!(
                    if name == "indexOf" {
                        F::IndexOf
                    } else {
                        F::LastIndexOf
                    },
                    Int
                )
            }
            Err(None)
        }
        ("lowerAscii", true, 1) if s.is(0, &Str) => ok!(F::LowerAscii, Str),
        ("upperAscii", true, 1) if s.is(0, &Str) => ok!(F::UpperAscii, Str),
        ("trim", true, 1) if s.is(0, &Str) => ok!(F::Trim, Str),
        ("replace", true, 3 | 4)
            if s.is(0, &Str) && s.is(1, &Str) && s.is(2, &Str) && (n == 3 || s.is(3, &Int)) =>
        {
            ok!(F::Replace, Str)
        }
        ("split", true, 2 | 3) if s.is(0, &Str) && s.is(1, &Str) && (n == 2 || s.is(2, &Int)) => {
            ok!(F::Split, List(Box::new(Str)))
        }
        ("substring", true, 2 | 3)
            if s.is(0, &Str) && s.is(1, &Int) && (n == 2 || s.is(2, &Int)) =>
        {
            ok!(F::Substring, Str)
        }
        ("join", true, 1 | 2) if Ty::list(Str).accepts(&t[0]) && (n == 1 || s.is(1, &Str)) => {
            ok!(F::Join, Str)
        }
        ("strings.quote", false, 1) if s.is(0, &Str) => ok!(F::Quote, Str),
        _ => return None,
    })
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::CharAt => char_at(a),
        Func::IndexOf | Func::LastIndexOf => index_of(f, a),
        Func::LowerAscii | Func::UpperAscii | Func::Trim => {
            let Str(s) = &a[0] else { return no_overload() };
            Ok(Value::str(&match f {
                Func::LowerAscii => s.to_ascii_lowercase(),
                Func::UpperAscii => s.to_ascii_uppercase(),
                _ => s.trim().to_string(),
            }))
        }
        Func::Replace => replace(a),
        Func::Split => split(a),
        Func::Substring => substring(a),
        Func::Join => join(a),
        Func::Quote => {
            let Str(s) = &a[0] else { return no_overload() };
            Ok(Value::str(&quote(s)))
        }
        _ => no_overload(),
    }
}

/// `CharAt`.
fn char_at(a: &[Value]) -> EvalResult {
    use Value::*;
    let (Str(s), Int(i)) = (&a[0], &a[1]) else {
        return no_overload();
    };
    let i = position(*i, s.chars().count())?;
    Ok(Value::str(
        &s.chars().nth(i).map(|c| c.to_string()).unwrap_or_default(),
    ))
}

/// `i` as a position in a string of `len` characters (`len` itself included), or cel-go's error.
fn position(i: i64, len: usize) -> Result<usize, String> {
    usize::try_from(i)
        .ok()
        .filter(|&p| p <= len)
        .ok_or_else(|| format!("index out of range: {i}"))
}

/// `IndexOf`, `LastIndexOf`, step by step as ext.Strings v2 (`indexOfOffset`,
/// `lastIndexOfOffset`): a negative offset fails, an empty substring is found at the offset
/// (clamped to the end), an offset past the end finds nothing.
fn index_of(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    let (Str(s), Str(sub)) = (&a[0], &a[1]) else {
        return no_overload();
    };
    let runes: Vec<char> = s.chars().collect();
    let subr: Vec<char> = sub.chars().collect();
    let (n, m) = (int_len(runes.len()), int_len(subr.len()));
    let last = f == Func::LastIndexOf;
    let off = match a.get(2) {
        Some(Int(i)) => *i,
        Some(_) => return no_overload(),
        None if !last => 0,
        // upstream compares the lengths in bytes here
        None if sub.is_empty() => return Ok(Int(n)),
        None if s.len() < sub.len() => return Ok(Int(-1)),
        None => n - 1,
    };
    if off < 0 {
        return Err(format!("index out of range: {off}"));
    }
    if sub.is_empty() {
        return Ok(Int(off.min(n)));
    }
    if off >= n {
        return Ok(Int(-1));
    }
    let at = |i: &i64| {
        usize::try_from(*i).is_ok_and(|i| runes.get(i..i + subr.len()) == Some(&subr[..]))
    };
    let found = if last {
        (0..=off.min(n - m)).rev().find(at)
    } else {
        (off..n - (m - 1)).find(at)
    };
    Ok(Int(found.unwrap_or(-1)))
}

/// `Replace`.
fn replace(a: &[Value]) -> EvalResult {
    use Value::*;
    let (Str(s), Str(from), Str(to)) = (&a[0], &a[1], &a[2]) else {
        return no_overload();
    };
    let n = match a.get(3) {
        Some(Int(n)) => *n,
        _ => -1,
    };
    // a negative count replaces every match
    Ok(Value::str(&match usize::try_from(n) {
        Ok(n) => s.replacen(from.as_ref(), to, n),
        Err(_) => s.replace(from.as_ref(), to),
    }))
}

/// `Split`.
fn split(a: &[Value]) -> EvalResult {
    use Value::*;
    let (Str(s), Str(sep)) = (&a[0], &a[1]) else {
        return no_overload();
    };
    let n = match a.get(2) {
        Some(Int(n)) => *n,
        _ => -1,
    };
    if n == 0 {
        return Ok(List(Arc::new(vec![])));
    }
    // at most `limit` parts (at least one here); a negative count has no limit
    let limit = usize::try_from(n).ok();
    let parts: Vec<Value> = if sep.is_empty() {
        let cs: Vec<String> = s.chars().map(|c| c.to_string()).collect();
        match limit {
            Some(n) if n < cs.len() => {
                let mut v: Vec<Value> = cs[..n - 1].iter().map(|c| Value::str(c)).collect();
                v.push(Value::str(&cs[n - 1..].concat()));
                v
            }
            _ => cs.iter().map(|c| Value::str(c)).collect(),
        }
    } else {
        match limit {
            Some(n) => s.splitn(n, sep.as_ref()).map(Value::str).collect(),
            None => s.split(sep.as_ref()).map(Value::str).collect(),
        }
    };
    Ok(List(Arc::new(parts)))
}

/// `Substring`.
fn substring(a: &[Value]) -> EvalResult {
    use Value::*;
    let (Str(s), Int(i)) = (&a[0], &a[1]) else {
        return no_overload();
    };
    let chars: Vec<char> = s.chars().collect();
    let i = position(*i, chars.len())?;
    let j = match a.get(2) {
        Some(Int(j)) => position(*j, chars.len())?,
        _ => chars.len(),
    };
    if i > j {
        return Err(format!("invalid substring range. start: {i}, end: {j}"));
    }
    Ok(Value::str(&chars[i..j].iter().collect::<String>()))
}

/// `Join`.
fn join(a: &[Value]) -> EvalResult {
    use Value::*;
    let List(l) = &a[0] else { return no_overload() };
    let sep = match a.get(1) {
        Some(Str(s)) => s.to_string(),
        _ => String::new(),
    };
    let mut parts = Vec::new();
    for x in l.iter() {
        let Str(s) = x else { return no_overload() };
        parts.push(s.to_string());
    }
    Ok(Value::str(&parts.join(&sep)))
}

pub(super) fn cost(f: Func, a: &[Value], result: &Value) -> u64 {
    let sz = |i: usize| a.get(i).map(size).unwrap_or(1);
    let k8s_sz = |i: usize| a.get(i).map(k8s_size).unwrap_or(1);
    match f {
        Func::Replace | Func::Split => tenths(k8s_sz(0), 2),
        Func::Join => tenths(k8s_size(result), 2),
        Func::LowerAscii | Func::UpperAscii | Func::Substring | Func::Trim => tenths(k8s_sz(0), 1),
        Func::Quote => tenths(sz(0), 1),
        Func::IndexOf | Func::LastIndexOf => a.first().map(traversal).unwrap_or(0),
        _ => 1,
    }
}

/// `strings.quote`: a double-quoted string with Go's letter escapes; everything else as is.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match go_escape(c) {
            Some(e) => out.push_str(e),
            None => out.push(c),
        }
    }
    out.push('"');
    out
}
