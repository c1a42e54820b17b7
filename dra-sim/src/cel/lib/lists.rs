//! ext.Lists v3 (`slice`, `flatten`, `distinct`, `lists.range`, `reverse`, `first`, `last`,
//! `sort`, the `sortBy` macro's sort, `indexOf` and `lastIndexOf` of lists) and the Kubernetes
//! lists library (`isSorted`, `sum`, `min`, `max`, `indexOf`/`lastIndexOf`, `includes`).
use super::overload::{Resolved, Sig};
use super::price::{list_alloc, size, traversal};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, NO_OVERLOAD, Value, b, equals, int_len, no_overload};
use std::cmp::Ordering;
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "isSorted",
    "sum",
    "min",
    "max",
    "slice",
    "flatten",
    "distinct",
    "sort",
    "first",
    "last",
    "lists.range",
    "includes",
    "indexOf",
    "lastIndexOf",
    "reverse",
];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("indexOf" | "lastIndexOf", true, 2) if s.list_like(0) => {
            ok!(
                if name == "indexOf" {
                    F::IndexOf
                } else {
                    F::LastIndexOf
                },
                Int
            )
        }
        ("reverse", true, 1) if s.list_like(0) => ok!(F::Reverse, t[0].clone()),
        ("isSorted", true, 1) if s.list_like(0) => ok!(F::IsSorted, Bool),
        ("sum", true, 1) if s.list_like(0) => ok!(F::Sum, t[0].elem()),
        ("min" | "max", true, 1) if s.list_like(0) => {
            ok!(if name == "min" { F::Min } else { F::Max }, t[0].elem())
        }
        ("slice", true, 3) if s.list_like(0) && s.is(1, &Int) && s.is(2, &Int) => {
            ok!(F::Slice, t[0].clone())
        }
        ("flatten", true, 1 | 2) if s.list_like(0) => ok!(F::Flatten, List(Box::new(Dyn))),
        ("distinct", true, 1) if s.list_like(0) => ok!(F::Distinct, t[0].clone()),
        ("sort", true, 1) if s.list_like(0) => ok!(F::Sort, t[0].clone()),
        ("includes", true, 2) => ok!(F::Includes, Bool),
        ("first" | "last", true, 1) if s.list_like(0) => {
            ok!(
                if name == "first" { F::First } else { F::Last },
                Ty::opt(t[0].elem())
            )
        }
        ("lists.range", false, 1) if s.is(0, &Int) => ok!(F::ListsRange, List(Box::new(Int))),
        _ => None,
    }
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::IndexOf | Func::LastIndexOf => index_of(f, a),
        Func::Reverse => match &a[0] {
            List(l) => Ok(List(Arc::new(l.iter().rev().cloned().collect()))),
            _ => no_overload(),
        },
        Func::IsSorted | Func::Sum | Func::Min | Func::Max | Func::Sort => aggregate(f, a),
        Func::Slice => slice(a),
        Func::Flatten => flatten(a),
        Func::Distinct => {
            let List(l) = &a[0] else { return no_overload() };
            let mut out: Vec<Value> = Vec::new();
            for x in l.iter() {
                if !out.iter().any(|y| equals(x, y).unwrap_or(false)) {
                    out.push(x.clone());
                }
            }
            Ok(List(Arc::new(out)))
        }
        Func::ListsRange => {
            let Int(n) = &a[0] else { return no_overload() };
            Ok(List(Arc::new((0..*n).map(Int).collect())))
        }
        Func::First | Func::Last => {
            let List(l) = &a[0] else { return no_overload() };
            let x = if f == Func::First {
                l.first()
            } else {
                l.last()
            };
            Ok(Optional(x.map(|v| Arc::new(v.clone()))))
        }
        Func::Includes => match &a[0] {
            List(l) => {
                for x in l.iter() {
                    if equals(x, &a[1]).unwrap_or(false) {
                        return b(true);
                    }
                }
                b(false)
            }
            x => b(equals(x, &a[1]).unwrap_or(false)),
        },
        Func::SortByKeys => sort_by_keys(a),
        _ => no_overload(),
    }
}

/// `IndexOf`, `LastIndexOf`.
fn index_of(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match &a[0] {
        List(l) => {
            let mut it: Box<dyn Iterator<Item = (usize, &Value)>> = if f == Func::IndexOf {
                Box::new(l.iter().enumerate())
            } else {
                Box::new(l.iter().enumerate().rev())
            };
            Ok(Int(it
                .find(|(_, x)| equals(x, &a[1]).unwrap_or(false))
                .map(|(i, _)| int_len(i))
                .unwrap_or(-1)))
        }
        _ => no_overload(),
    }
}

/// `IsSorted`, `Sum`, `Min`, `Max`, `Sort`.
fn aggregate(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    let List(l) = &a[0] else { return no_overload() };
    match f {
        Func::IsSorted => {
            for w in l.windows(2) {
                if super::stdlib::compare(&w[0], &w[1])?.ok_or(NO_OVERLOAD)? == Ordering::Greater {
                    return b(false);
                }
            }
            b(true)
        }
        Func::Sum => {
            let mut acc = match l.first() {
                None => return Ok(Int(0)),
                Some(v) => v.clone(),
            };
            for x in &l[1..] {
                acc = super::stdlib::call(Func::Add, &[acc, x.clone()])?;
            }
            Ok(acc)
        }
        Func::Min | Func::Max => {
            let Some(mut best) = l.first().cloned() else {
                return Err(format!(
                    "{}(list) argument must not be empty",
                    if f == Func::Min { "min" } else { "max" }
                ));
            };
            for x in &l[1..] {
                let o = super::stdlib::compare(x, &best)?.ok_or(NO_OVERLOAD)?;
                if (f == Func::Min && o == Ordering::Less)
                    || (f == Func::Max && o == Ordering::Greater)
                {
                    best = x.clone();
                }
            }
            Ok(best)
        }
        _ => {
            let mut v = (**l).clone();
            let mut err = None;
            v.sort_by(|x, y| match super::stdlib::compare(x, y) {
                Ok(Some(o)) => o,
                _ => {
                    err = Some("list elements must have the same type".to_string());
                    Ordering::Equal
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
            Ok(List(Arc::new(v)))
        }
    }
}

/// `Slice`.
fn slice(a: &[Value]) -> EvalResult {
    use Value::*;
    let (List(l), Int(s), Int(e)) = (&a[0], &a[1], &a[2]) else {
        return no_overload();
    };
    if *s < 0 || *e < 0 {
        return Err("cannot slice(start, end), negative indexes not supported".to_string());
    }
    if s > e {
        return Err(format!(
            "cannot slice({s}, {e}), start index must be less than or equal to end index"
        ));
    }
    // both are non-negative here
    match (usize::try_from(*s), usize::try_from(*e)) {
        (Ok(s), Ok(e)) if e <= l.len() => Ok(List(Arc::new(l[s..e].to_vec()))),
        _ => Err(format!(
            "cannot slice({s}, {e}), list is length {}",
            l.len()
        )),
    }
}

/// `Flatten`.
fn flatten(a: &[Value]) -> EvalResult {
    use Value::*;
    let List(l) = &a[0] else { return no_overload() };
    let depth = match a.get(1) {
        Some(Int(d)) => {
            if *d < 0 {
                return Err("level must be non-negative".into());
            }
            *d
        }
        _ => 1,
    };
    fn flat(l: &[Value], d: i64, out: &mut Vec<Value>) {
        for x in l {
            match x {
                Value::List(inner) if d > 0 => flat(inner, d - 1, out),
                _ => out.push(x.clone()),
            }
        }
    }
    let mut out = Vec::new();
    flat(l, depth, &mut out);
    Ok(List(Arc::new(out)))
}

/// `SortByKeys`.
fn sort_by_keys(a: &[Value]) -> EvalResult {
    use Value::*;
    let (List(l), List(keys)) = (&a[0], &a[1]) else {
        return no_overload();
    };
    let mut idx: Vec<usize> = (0..l.len()).collect();
    let mut err = None;
    idx.sort_by(|&i, &j| match super::stdlib::compare(&keys[i], &keys[j]) {
        Ok(Some(o)) => o,
        Ok(None) | Err(_) => {
            err.get_or_insert_with(|| "list elements must have the same type".to_string());
            Ordering::Equal
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    Ok(List(Arc::new(
        idx.into_iter().map(|i| l[i].clone()).collect(),
    )))
}

pub(super) fn cost(f: Func, a: &[Value], result: &Value) -> u64 {
    use Value::*;
    let sz = |i: usize| a.get(i).map(size).unwrap_or(1);
    match f {
        Func::Slice | Func::ListsRange => list_alloc(1.0, size(result)),
        Func::Reverse => match &a[0] {
            List(_) => list_alloc(1.0, size(result)),
            _ => 1,
        },
        Func::Flatten => {
            let depth = match a.get(1) {
                Some(Int(d)) => *d as f64,
                _ => 1.0,
            };
            list_alloc(if depth < 0.0 { 1.0 } else { depth }, sz(0))
        }
        Func::Distinct | Func::Sort | Func::SortByKeys => {
            let l = if f == Func::SortByKeys { &a[1] } else { &a[0] };
            match l {
                List(l) if !l.is_empty() => {
                    let factor = match l[0] {
                        Str(_) | Bytes(_) => 2.1,
                        _ => 2.0,
                    };
                    let n = l.len() as u64;
                    list_alloc(factor, n * n)
                }
                _ => list_alloc(2.0, 0),
            }
        }
        Func::IndexOf
        | Func::LastIndexOf
        | Func::IsSorted
        | Func::Sum
        | Func::Min
        | Func::Max
        | Func::Includes => a.first().map(traversal).unwrap_or(0),
        _ => 1,
    }
}
